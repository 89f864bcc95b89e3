package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// quotaCount is how many jobs of identity the queue quota counts.
func (c *cluster) quotaCount(identity string) int64 {
	n, err := c.rdb.ZCard(context.Background(), c.prefix+"{quota}:id:"+identity).Result()
	if err != nil {
		c.tb.Fatal(err)
	}
	return n
}

// openQueued posts a request that queues (no consumer runs) and returns
// its response once the headers arrived; cancel ends it.
func openQueued(t *testing.T, url, user string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	resp := postStream(t, ctx, url, prompt("wait "+user), map[string]string{"X-User-ID": user})
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return resp, cancel
}

// QUEUE_MAX_PER_IDENTITY=2, counted across two api processes: the third
// queued request of one identity is a 429 with Retry-After, another
// identity is unaffected, and a job that leaves the queue frees its place.
func TestQueueCapPerIdentity(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{
		"DIRECT_PATH_ENABLED": "false", "QUEUE_MAX_PER_IDENTITY": "2", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "60",
		// A client that leaves cancels its job at once, with no resume
		// window: its place must come free.
		"STREAM_RESUME_WINDOW_SECONDS": "0",
	})
	_, url1 := c.api(nil)
	_, url2 := c.api(nil)
	first, cancelFirst := openQueued(t, url1, "alice")
	second, _ := openQueued(t, url2, "alice")
	for _, r := range []*http.Response{first, second} {
		if r.StatusCode != http.StatusOK || r.Header.Get("X-Stream-Path") != protocol.PathQueued {
			t.Fatalf("HTTP %d path %q, want queued", r.StatusCode, r.Header.Get("X-Stream-Path"))
		}
	}
	if n := c.quotaCount("user:alice"); n != 2 {
		t.Fatalf("quota counts %d jobs of alice, want 2", n)
	}
	third := postStream(t, t.Context(), url1, prompt("third"), map[string]string{"X-User-ID": "alice"})
	if third.StatusCode != http.StatusTooManyRequests || third.Header.Get("Retry-After") == "" {
		third.Body.Close()
		t.Fatalf("third alice: HTTP %d Retry-After %q, want 429 with Retry-After", third.StatusCode, third.Header.Get("Retry-After"))
	}
	if p := readProblem(t, third); p.Slug() != protocol.ProblemTooManyQueued {
		t.Fatalf("problem %+v, want too-many-queued", p)
	}
	// X-User-ID "ip:127.0.0.1" is a user, not the IP's bucket, and bob is
	// another identity: both queue.
	for _, user := range []string{"bob", "ip:127.0.0.1"} {
		if r, _ := openQueued(t, url2, user); r.StatusCode != http.StatusOK {
			t.Fatalf("%s: HTTP %d while alice is at her cap", user, r.StatusCode)
		}
	}
	if n := c.backlog(); n != 4 {
		t.Fatalf("backlog %d, want 4 (the 429 enqueued nothing)", n)
	}
	// alice's first client leaves: her job is cancelled and its place freed.
	cancelFirst()
	testutil.Eventually(t, 5*time.Second, func() bool { return c.quotaCount("user:alice") == 1 }, "alice's place freed")
	if r, _ := openQueued(t, url1, "alice"); r.StatusCode != http.StatusOK {
		t.Fatalf("alice after a place was freed: HTTP %d", r.StatusCode)
	}
	// A worker starting the jobs empties the count.
	c.consumer(nil)
	testutil.Eventually(t, 10*time.Second, func() bool { return c.quotaCount("user:alice") == 0 && c.quotaCount("user:bob") == 0 },
		"started jobs released")
}

// QUEUE_MAX_BYTES bounds the backlog's bytes: a job that does not fit is
// a 503 queue-overflow (never a 413), and a small one still fits.
func TestQueueMaxBytes(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{
		"DIRECT_PATH_ENABLED": "false", "MAX_BODY_BYTES": "4096", "QUEUE_MAX_BYTES": "4096",
	})
	_, url := c.api(nil)
	big := strings.Repeat("x", 2500)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	first := postStream(t, ctx, url, prompt(big), map[string]string{"X-User-ID": "a"})
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first big job: HTTP %d", first.StatusCode)
	}
	second := postStream(t, t.Context(), url, prompt(big), map[string]string{"X-User-ID": "b"})
	if second.StatusCode != http.StatusServiceUnavailable {
		second.Body.Close()
		t.Fatalf("second big job: HTTP %d, want 503", second.StatusCode)
	}
	if p := readProblem(t, second); p.Slug() != protocol.ProblemQueueOverflow || p.RetryAfterSeconds < 1 {
		t.Fatalf("problem %+v, want queue-overflow with a retry", p)
	}
	if r, _ := openQueued(t, url, "c"); r.StatusCode != http.StatusOK {
		t.Fatalf("small job beside the big one: HTTP %d", r.StatusCode)
	}
}

// Redis at maxmemory with noeviction refuses writes with OOM: a request
// that must queue gets 503 queue-unavailable, not a 500.
func TestRedisOOMOnEnqueueIs503(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{"DIRECT_PATH_ENABLED": "false"})
	_, url := c.api(nil)
	ctx := context.Background()
	if err := c.rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.rdb.ConfigSet(context.Background(), "maxmemory", "0") })
	resp := postStream(t, t.Context(), url, prompt("no room"), nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		resp.Body.Close()
		t.Fatalf("HTTP %d, want 503", resp.StatusCode)
	}
	if p := readProblem(t, resp); p.Slug() != protocol.ProblemQueueUnavailable || p.RetryAfterSeconds < 1 {
		t.Fatalf("problem %+v, want queue-unavailable with a retry", p)
	}
	if n := c.backlog(); n != 0 {
		t.Fatalf("backlog %d after an OOM refusal", n)
	}
}

// Oversized headers and POST /v1/stream/ get problem documents; a model
// outside LLM_MODELS is a 400 that never reaches the upstream.
func TestHostileRequestsGetProblems(t *testing.T) {
	t.Parallel()
	sim, upstream := startSimllm(t, fastSim())
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{"LLM_MODELS": "model-a, model-b"})))

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/stream", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Padding", strings.Repeat("p", 70<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if p := readProblem(t, resp); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || p.Slug() != protocol.ProblemHeadersTooLarge {
		t.Fatalf("70 KiB header: HTTP %d %+v, want a 431 headers-too-large problem", resp.StatusCode, p)
	}

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.Post(url+"/v1/stream/", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if p := readProblem(t, resp); resp.StatusCode != http.StatusNotFound || p.Slug() != protocol.ProblemNotFound {
		t.Fatalf("POST /v1/stream/: HTTP %d %+v, want a 404 problem", resp.StatusCode, p)
	}

	body := map[string]any{"model": "model-c", "messages": userMsgs("x")}
	resp = postStream(t, t.Context(), url, body, nil)
	if p := readProblem(t, resp); resp.StatusCode != http.StatusBadRequest || p.Slug() != protocol.ProblemBadRequest {
		t.Fatalf("model-c: HTTP %d %+v, want 400", resp.StatusCode, p)
	}
	if n := sim.Requests(); n != 0 {
		t.Fatalf("upstream got %d requests for a refused model", n)
	}
	body["model"] = "model-b"
	resp = postStream(t, t.Context(), url, body, nil)
	rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
	resp.Body.Close()
	if rep.Terminal != protocol.EventDone {
		t.Fatalf("model-b: %+v", rep)
	}
}

// Past MAX_CONNECTIONS, with no connection idle, a connection gets a 503
// problem and is closed, instead of hanging; once one closes, a new one is
// served.
func TestMaxConnections(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, slowSim())
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{"MAX_CONNECTIONS": "3", "CONNECTION_POOL_PER_USER": "4", "STREAM_RESUME_WINDOW_SECONDS": "0"})))
	addr := strings.TrimPrefix(url, "http://")
	var held []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
		// Each holds an open stream: active, not idle.
		body := `{"messages":[{"role":"user","content":"held"}]}`
		fmt.Fprintf(c, "POST /v1/stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("held stream %d: %v %v", i, resp, err)
		}
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	status, body := rawGet(t, extra, "/healthz")
	var p protocol.Problem
	if status != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &p) != nil || p.Slug() != protocol.ProblemTooManyConnections {
		t.Fatalf("4th connection beside 3 streams: HTTP %d %q, want a 503 too-many-connections problem", status, body)
	}
	held[1].Close()
	testutil.Eventually(t, 5*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		s, _ := rawGet(t, c, "/healthz")
		return s == http.StatusOK
	}, "a connection served after one closed")
}

// Idle keep-alive connections give way at MAX_CONNECTIONS (issue 29): with
// the cap held by connections that sent one request and idle, a new client
// is served, and the longest idle connection is the one closed for it.
func TestMaxConnectionsClosesIdleFirst(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, fastSim())
	a, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{"MAX_CONNECTIONS": "3"})))
	addr := strings.TrimPrefix(url, "http://")
	var held []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if status, _ := rawGet(t, c, "/healthz"); status != http.StatusOK {
			t.Fatalf("connection %d: HTTP %d", i, status)
		}
		held = append(held, c)
		// The server marks a connection idle just after it sent the
		// answer, which the client may read first: the next connection
		// waits for it, so the idle order is the order of the requests.
		testutil.Eventually(t, 5*time.Second, func() bool { return a.idleConns() == i+1 }, fmt.Sprintf("connection %d idle", i))
	}
	for round := range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if status, body := rawGet(t, c, "/healthz"); status != http.StatusOK {
			t.Fatalf("new connection %d beside 3 idle ones: HTTP %d %q, want 200", round, status, body)
		}
		// The longest idle one was closed for it.
		if msg, err := waitClosed(held[round], 5*time.Second); err != nil {
			t.Fatalf("idle connection %d not closed (%s): %v", round, msg, err)
		}
	}
	if status, _ := rawGet(t, held[2], "/healthz"); status != http.StatusOK {
		t.Fatalf("the most recently idle connection: HTTP %d, want it still served", status)
	}
}

// HTTP_IDLE_TIMEOUT_SECONDS closes a keep-alive connection that idles
// that long (issue 29: it was the server's fixed 120 s), and not one that
// idles less.
func TestHTTPIdleTimeoutClosesIdleConnections(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, fastSim())
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{"HTTP_IDLE_TIMEOUT_SECONDS": "2"})))
	addr := strings.TrimPrefix(url, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if status, _ := rawGet(t, c, "/healthz"); status != http.StatusOK {
		t.Fatalf("first request: HTTP %d", status)
	}
	idle := time.Now()
	// Well within the timeout the connection still serves: a 1 s idle
	// second request, which starts the idle time again.
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := c.Read(make([]byte, 1)); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection closed or answered after %v idle of a 2 s timeout: %d bytes, %v", time.Since(idle), n, err)
	}
	if status, _ := rawGet(t, c, "/healthz"); status != http.StatusOK {
		t.Fatalf("request after 1 s idle: HTTP %d", status)
	}
	idle = time.Now()
	// Then it is closed once idle for the timeout (the rest is room for a
	// loaded machine; the old fixed timeout was 120 s).
	if msg, err := waitClosed(c, 15*time.Second); err != nil {
		t.Fatalf("idle connection not closed within 15 s of a 2 s idle timeout (%q): %v", msg, err)
	}
	// The server's idle time began when it wrote the answer, a little
	// before this client read it: a close after less than 1 s is early.
	if d := time.Since(idle); d < time.Second {
		t.Fatalf("idle connection closed after %v, well before the 2 s idle timeout", d)
	}
}

// rawGet sends one GET on c and returns the status and body.
func rawGet(t *testing.T, c net.Conn, path string) (int, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return 0, err.Error()
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// apiProc is cmd/api running as a process.
type apiProc struct {
	*proc
	pprof string
}

var apiAddrRe = regexp.MustCompile(`"msg":"api listening".*"addr":"([^"]+)"`)
var pprofAddrRe = regexp.MustCompile(`"msg":"pprof listening".*"addr":"([^"]+)"`)

// startAPIProc runs the built cmd/api with env and -pprof on a free port.
func startAPIProc(tb testing.TB, env map[string]string) *apiProc {
	tb.Helper()
	cmd := exec.Command(binary(tb, "api"), "-pprof", "127.0.0.1:0")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=info"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := &apiProc{proc: &proc{tb: tb, cmd: cmd, exited: make(chan struct{})}}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var pp string
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			if m := pprofAddrRe.FindStringSubmatch(line); m != nil {
				pp = m[1]
			}
			if m := apiAddrRe.FindStringSubmatch(line); m != nil {
				addrs <- [2]string{m[1], pp}
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() || testing.Verbose() {
			tb.Logf("api %d log:\n%s", cmd.Process.Pid, p.Log())
		}
	})
	select {
	case a := <-addrs:
		p.addr, p.pprof = a[0], a[1]
	case <-p.exited:
		tb.Fatalf("api exited at start:\n%s", p.Log())
	case <-time.After(20 * time.Second):
		tb.Fatalf("api did not start:\n%s", p.Log())
	}
	return p
}

var goroutineTotalRe = regexp.MustCompile(`goroutine profile: total (\d+)`)

// goroutines reads the process's goroutine count from its pprof endpoint.
func (p *apiProc) goroutines() int {
	p.tb.Helper()
	b, err := p.goroutineProfile(1 << 10)
	if err != nil {
		p.tb.Fatalf("pprof: %v", err)
	}
	m := goroutineTotalRe.FindSubmatch(b)
	if m == nil {
		p.tb.Fatalf("no goroutine total in %q", b)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// goroutineProfile reads the first limit bytes of the process's goroutine
// profile: the total, then the goroutines grouped by stack, the most
// numerous first.
func (p *apiProc) goroutineProfile(limit int64) ([]byte, error) {
	resp, err := http.Get("http://" + p.pprof + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(io.LimitReader(resp.Body, limit))
}

// goroutineDump is the goroutine profile's first 8 KiB, for a failure
// message.
func (p *apiProc) goroutineDump() string {
	b, err := p.goroutineProfile(8 << 10)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// exitWithin waits for the process to exit and returns its exit code.
func (p *apiProc) exitWithin(d time.Duration) (int, time.Duration, bool) {
	start := time.Now()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode(), time.Since(start), true
	case <-time.After(d):
		return 0, d, false
	}
}

// halfBody opens a connection that sends headers and part of a body,
// then nothing more.
func halfBody(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = fmt.Fprintf(c, "POST /v1/stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\":[")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitClosed reads c until the server closes it, within d; it returns
// what was read.
func waitClosed(c net.Conn, d time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	if err != nil {
		return string(b), err
	}
	return string(b), nil
}

// 200 half-body connections, normal traffic and an endless stream, then
// SIGTERM with a 2s grace, on the built cmd/api against real Redis: the
// half-body connections get a 408 problem and are closed within the body
// timeout, goroutines come back to the baseline, /readyz is 503 from the
// first moment of the drain, the endless stream ends with shutting-down
// after the grace, and the process exits within grace + a few seconds.
func TestHostileClientsAndBoundedDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and the api binary")
	}
	t.Parallel()
	sc := fastSim()
	sc.TokenInterval = 10 * time.Millisecond
	// 300 s at 10 ms: endless here. The simulator builds a whole answer
	// before its first chunk; 1,000,000 chunks took it 2 to 5 s under the
	// race detector, which every normal request below waited for.
	sc.Tokens = 30_000
	c := newCluster(t, sc, nil)
	const bodyTimeout = 2 * time.Second
	p := startAPIProc(t, c.with(map[string]string{
		"SHUTDOWN_GRACE_SECONDS": "2", "BODY_READ_TIMEOUT_SECONDS": "2",
		"CONNECTION_POOL_SIZE": "50", "CONNECTION_POOL_PER_USER": "50",
		// The normal requests below leave their endless streams: without a
		// resume window those end at once, so the goroutines come back.
		"STREAM_RESUME_WINDOW_SECONDS": "0",
	}))
	url := "http://" + p.addr
	// Warm up: one direct stream through every step, so what starts on
	// first use (the pool's reclaim subscription, the stream log's
	// writer, upstream connections) is in the baseline.
	warm := postStream(t, t.Context(), url, prompt("warm-up"), nil)
	if _, err := io.ReadFull(warm.Body, make([]byte, 1)); err != nil || warm.StatusCode != http.StatusOK {
		t.Fatalf("warm-up: HTTP %d %v", warm.StatusCode, err)
	}
	warm.Body.Close()
	testutil.Eventually(t, 10*time.Second, func() bool {
		return scrape(t, url+"/metrics", `spillway_active_streams{path="direct"}`) == 0
	}, "warm-up stream ended")
	baseline := p.goroutines()

	opened := time.Now()
	conns := make([]net.Conn, 200)
	for i := range conns {
		conns[i] = halfBody(t, p.addr)
	}
	// Normal traffic is served meanwhile: a first chunk within a second.
	for i := range 5 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		resp := postStream(t, ctx, url, prompt(fmt.Sprint("normal ", i)), nil)
		first := make([]byte, 1)
		if _, err := io.ReadFull(resp.Body, first); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("normal request %d: HTTP %d %v", i, resp.StatusCode, err)
		}
		resp.Body.Close()
		cancel()
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for _, conn := range conns {
		wg.Go(func() {
			got, err := waitClosed(conn, bodyTimeout+3*time.Second)
			if err != nil {
				errs <- fmt.Errorf("not closed after %v: %w", time.Since(opened), err)
			} else if !strings.Contains(got, " 408 ") || !strings.Contains(got, protocol.ProblemRequestTimeout) {
				errs <- fmt.Errorf("answer %q, want a 408 request-timeout problem", got)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Back to the baseline is what counts, not how fast a loaded machine
	// gets there.
	if !testutil.Within(20*time.Second, func() bool { return p.goroutines() <= baseline+5 }) {
		t.Fatalf("goroutines %d, not back to the baseline %d within 20s:\n%s", p.goroutines(), baseline, p.goroutineDump())
	}

	// The drain: an endless stream and fresh half-body connections open.
	endless := postStream(t, t.Context(), url, prompt("endless"), nil)
	defer endless.Body.Close()
	late := []net.Conn{halfBody(t, p.addr), halfBody(t, p.addr)}
	signalled := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Second, func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, "readyz 503 at the start of the drain")
	resp := postStream(t, t.Context(), url, prompt("too late"), nil)
	if pr := readProblem(t, resp); resp.StatusCode != http.StatusServiceUnavailable || pr.Slug() != protocol.ProblemShuttingDown {
		t.Fatalf("a new stream during the drain: HTTP %d %+v, want 503 shutting-down", resp.StatusCode, pr)
	}
	rep := loadtest.StreamCheck{Want: nil}.Check(endless.Body)
	if rep.Terminal != protocol.EventError || rep.Problem.Slug() != protocol.ProblemShuttingDown {
		t.Fatalf("endless stream: %+v", rep)
	}
	for _, conn := range late {
		if _, err := waitClosed(conn, bodyTimeout+3*time.Second); err != nil {
			t.Fatalf("half-body connection open during the drain not closed: %v", err)
		}
	}
	code, _, ok := p.exitWithin(2*time.Second + 5*time.Second - time.Since(signalled))
	if !ok {
		t.Fatalf("api still running %v after SIGTERM with a 2s grace", time.Since(signalled))
	}
	if code != 0 {
		t.Fatalf("exit code %d after a clean drain", code)
	}
}

// A second SIGTERM during the drain exits at once, long before the grace.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and the api binary")
	}
	t.Parallel()
	sc := fastSim()
	sc.TokenInterval = 10 * time.Millisecond
	sc.Tokens = 30_000 // 300 s at 10 ms: endless here (see TestHostileClientsAndBoundedDrain)
	c := newCluster(t, sc, nil)
	p := startAPIProc(t, c.with(map[string]string{"SHUTDOWN_GRACE_SECONDS": "60"}))
	endless := postStream(t, t.Context(), "http://"+p.addr, prompt("endless"), nil)
	defer endless.Body.Close()
	if _, err := io.ReadFull(endless.Body, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return strings.Contains(p.Log(), "a second signal exits at once") }, "drain began")
	if _, _, ok := p.exitWithin(time.Second); ok {
		t.Fatal("api exited on the first SIGTERM while a stream was open and the grace is 60s")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, took, ok := p.exitWithin(3 * time.Second)
	if !ok {
		t.Fatal("api still running 3s after a second SIGTERM")
	}
	if code != exitSecondSignalCode {
		t.Fatalf("exit code %d after %v, want %d", code, took, exitSecondSignalCode)
	}
}

// exitSecondSignalCode is cmd/api's exit status after a second signal.
const exitSecondSignalCode = 3

var heapAllocRe = regexp.MustCompile(`# HeapAlloc = (\d+)`)

// heapAfterGC reads the process's live heap after a forced GC.
func (p *apiProc) heapAfterGC() int64 {
	p.tb.Helper()
	resp, err := http.Get("http://" + p.pprof + "/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		p.tb.Fatalf("pprof: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := heapAllocRe.FindSubmatch(b)
	if m == nil {
		p.tb.Fatal("no HeapAlloc in the heap profile")
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

// rss reads the process's resident set size.
func (p *apiProc) rss() int64 {
	p.tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		p.tb.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		p.tb.Fatal("no VmRSS")
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n << 10
}

// A stream waiting in the queue costs the api its connection and relay,
// not its job's payload: 100 waiting streams with 100 KiB bodies, on the
// built cmd/api against real Redis. The figures go to docs/BENCHMARKS.md.
func TestWaitingStreamMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and the api binary")
	}
	t.Parallel()
	const streams, bodyKiB = 100, 100
	c := newCluster(t, fastSim(), map[string]string{"DIRECT_PATH_ENABLED": "false", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "120",
		// Streams whose client left end at once: the warm-up waits for that.
		"STREAM_RESUME_WINDOW_SECONDS": "0"})
	p := startAPIProc(t, c.env)
	url := "http://" + p.addr
	// Warm up: one stream through every step, so first-use allocations
	// are in the baseline.
	r, cancel := openQueued(t, url, "warmup")
	if r.StatusCode != http.StatusOK {
		t.Fatalf("warm-up: HTTP %d", r.StatusCode)
	}
	cancel()
	testutil.Eventually(t, 5*time.Second, func() bool { return c.quotaCount("user:warmup") == 0 }, "warm-up released")
	heap0, rss0 := p.heapAfterGC(), p.rss()

	text := strings.Repeat("y", bodyKiB<<10)
	for i := range streams {
		ctx, cancel := context.WithCancel(t.Context())
		resp := postStream(t, ctx, url, prompt(text), map[string]string{"X-User-ID": fmt.Sprint("u", i)})
		t.Cleanup(func() { cancel(); resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: HTTP %d", i, resp.StatusCode)
		}
	}
	if n := c.backlog(); n != streams+1 {
		t.Fatalf("backlog %d, want %d waiting", n, streams+1)
	}
	heap1, rss1 := p.heapAfterGC(), p.rss()
	perHeap, perRSS := (heap1-heap0)/streams, (rss1-rss0)/streams
	t.Logf("%d waiting streams with %d KiB bodies: heap %+d KiB per stream, RSS %+d KiB per stream (heap %d -> %d KiB, RSS %d -> %d KiB)",
		streams, bodyKiB, perHeap>>10, perRSS>>10, heap0>>10, heap1>>10, rss0>>10, rss1>>10)
	// Holding the payload would cost more than the body (its decoded
	// strings); the relay keeps names and a deadline, and what remains is
	// the connection's and the result channels' buffers (about 32 KiB).
	if perHeap > (bodyKiB<<10)/2 {
		t.Fatalf("heap grows %d KiB per waiting stream: a waiting stream keeps its payload", perHeap>>10)
	}
}
