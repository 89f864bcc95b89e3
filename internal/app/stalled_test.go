//go:build linux

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// endlessMarker in a prompt makes floodUpstream's answer endless.
const endlessMarker = "endless-flood"

// floodUpstream is an OpenAI-compatible upstream. A prompt holding
// endlessMarker gets an answer that never ends: a burst of 2 KiB chunks,
// far more than the socket buffers of a client that does not read, then
// a short chunk every 100ms until the caller leaves. Any other prompt is
// the simulator's finite answer.
type floodUpstream struct {
	url     string
	endless atomic.Int64 // endless answers under way
	calls   atomic.Int64 // endless answers begun
}

const (
	floodBurstChunks = 64
	floodChunkBytes  = 2 << 10
)

func startFloodUpstream(tb testing.TB, sc llm.SimConfig) *floodUpstream {
	tb.Helper()
	sim, err := llm.NewSim(sc)
	if err != nil {
		tb.Fatal(err)
	}
	inner := simserver.New(sim, testLog(tb))
	u := &floodUpstream{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "read body", http.StatusBadRequest)
			return
		}
		if !bytes.Contains(body, []byte(endlessMarker)) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			inner.ServeHTTP(w, r)
			return
		}
		u.calls.Add(1)
		u.endless.Add(1)
		defer u.endless.Add(-1)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		big := strings.Repeat("x", floodChunkBytes)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			content := "tick "
			if i < floodBurstChunks {
				content = big
			} else {
				select {
				case <-r.Context().Done():
					return
				case <-tick.C:
				}
			}
			chunk, _ := json.Marshal(map[string]any{
				"id": "flood", "object": "chat.completion.chunk", "created": 0, "model": "flood",
				"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": content}, "finish_reason": nil}},
			})
			if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
	}))
	tb.Cleanup(ts.Close)
	u.url = ts.URL + "/v1"
	return u
}

// stalledReader posts an endless request and never reads the answer. Its
// socket advertises a small receive buffer and a common Internet segment
// size, so the server's send buffer stays as small as across a real
// network (on loopback, with its 64 KiB segments, the kernel would let the
// server queue megabytes before a write blocks).
func stalledReader(t *testing.T, addr, user string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
			if serr == nil {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 1400)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body, _ := json.Marshal(prompt(endlessMarker + " " + user))
	_, err = fmt.Fprintf(c, "POST /v1/stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-User-ID: %s\r\nContent-Length: %d\r\n\r\n%s",
		user, len(body), body)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// openStalled opens n stalled readers, users prefix-0 … prefix-(n-1).
func openStalled(t *testing.T, addr, prefix string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = stalledReader(t, addr, fmt.Sprintf("%s-%d", prefix, i))
	}
	return conns
}

// checkCut reads what each stalled reader was sent: the server must have
// closed the connection, and no stream may have been answered to its end.
func checkCut(t *testing.T, conns []net.Conn, within time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(conns))
	for _, c := range conns {
		wg.Go(func() {
			got, err := waitClosed(c, within)
			switch {
			case err != nil && !isReset(err):
				errs <- fmt.Errorf("stalled reader not closed by the server: %w (read %d bytes)", err, len(got))
			case strings.Contains(got, "event: done"):
				errs <- fmt.Errorf("a stalled reader's endless stream ended in done")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// isReset reports a connection the server reset: closed too, with data
// it had not sent yet.
func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe"))
}

// 200 queued streams whose readers never read, beside normal traffic, on
// the built cmd/api against real Redis and a consumer process. Before
// any signal: every stalled reader is cut once a write waits the write
// timeout (10s) — the log says so for each — its job is cancelled (the
// upstream call ends, the consumer counts it cancelled), its connection
// is closed, and the api's goroutines come back to the baseline, while
// normal requests are answered in full. Then 200 more stalled readers and
// 200 half-body connections, and SIGTERM with a 2s grace: the process
// exits cleanly within grace + 15s, every job of a stalled reader is
// cancelled, and every connection is closed.
func TestStalledReadersCutAndShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, the api and a consumer")
	}
	t.Parallel()
	const stalled = 200
	up := startFloodUpstream(t, fastSim())
	c := newCluster(t, fastSim(), map[string]string{
		"LLM_BASE_URL": up.url, "DIRECT_PATH_ENABLED": "false",
		"CONNECTION_POOL_SIZE": "500", "CONNECTION_POOL_PER_USER": "5",
		"QUEUE_FAILOVER_TIMEOUT_SECONDS": "60", "SHUTDOWN_GRACE_SECONDS": "2", "BODY_READ_TIMEOUT_SECONDS": "2",
		// A cut stream waits for a resume this long, then is cancelled.
		"STREAM_RESUME_WINDOW_SECONDS": "2",
		// The default liveness: 200 busy jobs on a loaded machine must not
		// lose their claims to the harness's quick reclaim.
		"WORKER_HEARTBEAT_SECONDS": "5", "QUEUE_RECLAIM_IDLE_SECONDS": "15",
	})
	consumer := c.consumer(map[string]string{"WORKER_CONCURRENCY": "250", "LOG_LEVEL": "info"})
	p := startAPIProc(t, c.env)
	url := "http://" + p.addr
	normal := func(i int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		resp := postStream(t, ctx, url, prompt(fmt.Sprint("normal ", i)), map[string]string{"X-User-ID": fmt.Sprint("normal-", i)})
		rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || rep.Terminal != protocol.EventDone {
			t.Fatalf("normal request %d: HTTP %d %+v", i, resp.StatusCode, rep)
		}
	}
	// Warm up the queued path, so its lazily started goroutines are in the
	// baseline.
	normal(-1)
	baseline := p.goroutines()
	cancelled := `spillway_worker_jobs_total{outcome="cancelled"}`

	opened := time.Now()
	first := openStalled(t, p.addr, "stalled", stalled)
	// Every job starts (the first may be cut before the last starts).
	testutil.Eventually(t, 60*time.Second, func() bool { return up.calls.Load() >= stalled },
		fmt.Sprintf("%d endless answers begun", stalled))
	for i := range 5 {
		normal(i)
	}
	cuts := func() int { return strings.Count(p.Log(), `"msg":"client too slow, stream cut"`) }
	// The write timeout (10s) after the sockets filled, on a loaded machine.
	testutil.Eventually(t, 60*time.Second, func() bool { return cuts() >= stalled },
		fmt.Sprintf("%d stalled readers cut for a write timeout", stalled))
	t.Logf("%d stalled readers cut %v after they opened", stalled, time.Since(opened).Round(time.Millisecond))
	if n := cuts(); n != stalled {
		t.Fatalf("%d streams cut as too slow, want %d (normal readers are never cut)", n, stalled)
	}
	// The resume window (2s), then the cancel reaches the worker.
	testutil.Eventually(t, 30*time.Second, func() bool { return up.endless.Load() == 0 }, "every stalled reader's upstream call ended")
	testutil.Eventually(t, 10*time.Second, func() bool { return consumer.Metric(cancelled) == stalled },
		fmt.Sprintf("consumer counts %d jobs cancelled", stalled))
	checkCut(t, first, 10*time.Second)
	testutil.Eventually(t, 20*time.Second, func() bool { return p.goroutines() <= baseline+5 },
		fmt.Sprintf("goroutines back to the baseline %d", baseline))

	// The drain, with as many stalled readers and half-sent bodies open.
	second := openStalled(t, p.addr, "late", stalled)
	half := make([]net.Conn, stalled)
	for i := range half {
		half[i] = halfBody(t, p.addr)
	}
	testutil.Eventually(t, 60*time.Second, func() bool { return up.calls.Load() >= 2*stalled },
		fmt.Sprintf("%d more endless answers begun", stalled))
	signalled := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, took, ok := p.exitWithin(2*time.Second + 15*time.Second)
	if !ok {
		t.Fatalf("api still running %v after SIGTERM with a 2s grace", time.Since(signalled))
	}
	t.Logf("api exited %v after SIGTERM with %d stalled readers and %d half-sent bodies open", took.Round(time.Millisecond), stalled, stalled)
	if code != 0 {
		t.Fatalf("exit code %d after the drain", code)
	}
	testutil.Eventually(t, 15*time.Second, func() bool { return up.endless.Load() == 0 }, "every late stalled reader's upstream call ended")
	testutil.Eventually(t, 10*time.Second, func() bool { return consumer.Metric(cancelled) == 2*stalled },
		fmt.Sprintf("consumer counts %d jobs cancelled", 2*stalled))
	if n := up.calls.Load(); n != 2*stalled {
		t.Fatalf("%d endless upstream calls, want %d (a cancelled job is never retried)", n, 2*stalled)
	}
	checkCut(t, second, 5*time.Second)
	for _, h := range half {
		if _, err := waitClosed(h, 5*time.Second); err != nil && !isReset(err) {
			t.Fatalf("half-body connection not closed by the drain: %v", err)
		}
	}
}
