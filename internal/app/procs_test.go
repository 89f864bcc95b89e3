package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the commands built once for every test of the package.
var binDir string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "spillway-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		return m.Run()
	}()
	os.Exit(code)
}

// builds holds one build per command, so a test that needs only the
// consumer does not wait for the api's build too.
var builds sync.Map // command name -> func() error

// binary returns the path of a command of this module, built on first use.
func binary(tb testing.TB, name string) string {
	tb.Helper()
	build, _ := builds.LoadOrStore(name, sync.OnceValue(func() error {
		cmd := exec.Command("go", "build", "-o", binDir+string(os.PathSeparator), "../../cmd/"+name)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", name, err, out)
		}
		return nil
	}))
	if err := build.(func() error)(); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(binDir, name)
}

// proc is a child process of the test with its log captured.
type proc struct {
	tb     testing.TB
	cmd    *exec.Cmd
	mu     sync.Mutex
	log    strings.Builder
	addr   string // from its start log line
	exited chan struct{}
}

var httpAddrRe = regexp.MustCompile(`"http":"([^"]+)"`)

// startConsumer runs cmd/consumer with env (added to a minimal environment)
// and waits until it logged that it started.
func startConsumer(tb testing.TB, env map[string]string) *proc {
	tb.Helper()
	cmd := exec.Command(binary(tb, "consumer"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "CONSUMER_HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=debug"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := &proc{tb: tb, cmd: cmd, exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	started := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			if strings.Contains(line, `"msg":"consumer started"`) {
				if m := httpAddrRe.FindStringSubmatch(line); m != nil {
					select {
					case started <- m[1]:
					default:
					}
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() || testing.Verbose() {
			tb.Logf("consumer %d log:\n%s", cmd.Process.Pid, p.Log())
		}
	})
	select {
	case p.addr = <-started:
	case <-p.exited:
		tb.Fatalf("consumer exited at start:\n%s", p.Log())
	case <-time.After(20 * time.Second):
		tb.Fatalf("consumer did not start:\n%s", p.Log())
	}
	return p
}

// Log returns what the process logged so far.
func (p *proc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Metric scrapes the process's /metrics and returns the value of the
// sample whose name and labels start with series (e.g.
// `spillway_worker_jobs_total{outcome="done"}`), 0 when absent.
func (p *proc) Metric(series string) float64 {
	p.tb.Helper()
	return scrape(p.tb, "http://"+p.addr+"/metrics", series)
}

func scrape(tb testing.TB, url, series string) float64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, series+" ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(line[len(series):]), 64)
			if err != nil {
				tb.Fatalf("metric %s: %v", line, err)
			}
			return v
		}
	}
	return 0
}
