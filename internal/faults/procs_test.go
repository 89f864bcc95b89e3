package faults

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The scenarios with whole processes (scenarios 3 and 4, and the api
// crash) run the built cmd/api, cmd/consumer and cmd/simllm, so a SIGKILL
// is a real crash: sockets close, nothing runs a deferred cleanup.

// binDir holds the commands built once for every test of the package.
var binDir string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "spillway-faults-bin-")
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

// build builds the three commands the scenarios run, once, in one go
// build (they share most packages), on first use.
var build = sync.OnceValue(func() error {
	cmd := exec.Command("go", "build", "-o", binDir+string(os.PathSeparator), "../../cmd/api", "../../cmd/consumer", "../../cmd/simllm")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	return nil
})

// binary returns the path of a command of this module (api, consumer or
// simllm), built on first use.
func binary(tb testing.TB, name string) string {
	tb.Helper()
	if err := build(); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(binDir, name)
}

// proc is a child process of the test with its JSON log captured.
type proc struct {
	tb     testing.TB
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []string
	addr   string // the HTTP address from its start log line
	exited chan struct{}
}

// The start lines of the commands, each giving the HTTP address.
var (
	apiReady      = regexp.MustCompile(`"msg":"api listening".*"addr":"([^"]+)"`)
	consumerReady = regexp.MustCompile(`"msg":"consumer started".*"http":"([^"]+)"`)
	simllmReady   = regexp.MustCompile(`"msg":"simllm listening".*"addr":"([^"]+)"`)
)

// start runs the command name with args and env (added to a minimal
// environment) and waits until it logged the line ready matches. The
// process is killed when the test ends; its log is shown when the test
// failed.
func start(tb testing.TB, name string, args []string, env map[string]string, ready *regexp.Regexp) *proc {
	tb.Helper()
	cmd := exec.Command(binary(tb, name), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := &proc{tb: tb, name: name, cmd: cmd, exited: make(chan struct{})}
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
			p.lines = append(p.lines, line)
			p.mu.Unlock()
			if m := ready.FindStringSubmatch(line); m != nil {
				select {
				case started <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("%s %d log (last 60 lines):\n%s", name, cmd.Process.Pid, p.tail(60))
		}
	})
	select {
	case p.addr = <-started:
	case <-p.exited:
		tb.Fatalf("%s exited at start:\n%s", name, p.tail(60))
	case <-time.After(30 * time.Second):
		tb.Fatalf("%s did not start:\n%s", name, p.tail(60))
	}
	return p
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// URL is the process's HTTP base URL.
func (p *proc) URL() string { return "http://" + p.addr }

func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines[max(0, len(p.lines)-n):], "\n")
}

// logEntry is the part of a JSON log line the scenarios read.
type logEntry struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	RequestID string    `json:"request_id"`
}

// entries returns the log lines whose msg is msg.
func (p *proc) entries(msg string) []logEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []logEntry
	needle := `"msg":"` + msg + `"`
	for _, line := range p.lines {
		if !strings.Contains(line, needle) {
			continue
		}
		var e logEntry
		if json.Unmarshal([]byte(line), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}

// mentions returns the log lines that contain s.
func (p *proc) mentions(s string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, line := range p.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}
