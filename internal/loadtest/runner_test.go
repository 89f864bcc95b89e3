package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

const (
	testSeed   = 7
	testTokens = 6
)

// streamFunc writes one crafted response for the prompt number n; want is
// the simulator's answer to that prompt.
type streamFunc func(w http.ResponseWriter, r *http.Request, n int, want []string)

// newServer serves crafted streams, decoding each request as the api would.
func newServer(tb testing.TB, fn streamFunc) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		req, err := protocol.DecodeChatRequest(body, protocol.DefaultLimits)
		if err != nil || r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		_, num, _ := strings.Cut(req.Messages[0].Content, "#")
		n, err := strconv.Atoi(num)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		want := llm.SimChunks(req.Messages, testSeed, testTokens)
		if req.MaxTokens > 0 && req.MaxTokens < len(want) {
			want = want[:req.MaxTokens]
		}
		fn(w, r, n, want)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// sse starts a 200 event stream on path and returns a function writing
// and flushing raw frames.
func sse(w http.ResponseWriter, path string) func(string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Stream-Path", path)
	w.Header().Set("X-Request-ID", "req-"+path)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	return func(s string) {
		_, _ = io.WriteString(w, s)
		_ = rc.Flush()
	}
}

// doneFrame is the done event with id (ids count over every event).
func doneFrame(id int, path string) string {
	b, _ := json.Marshal(protocol.Done{FinishReason: "stop", Path: path})
	return string(protocol.AppendIDEvent(nil, int64(id), protocol.EventDone, b))
}

func testConfig(url string) Config {
	return Config{
		URL:         url,
		Concurrency: 4,
		Requests:    8,
		Seed:        testSeed,
		Tokens:      testTokens,
		Verify:      true,
		Timeout:     30 * time.Second,
	}
}

// checkTally fails unless every request is counted exactly once.
func checkTally(tb testing.TB, res *Result) {
	tb.Helper()
	sum := res.Done + res.Errors + res.Refused + res.Disconnected + res.Aborted + res.Lost
	if sum != res.Requests {
		tb.Errorf("outcomes add up to %d, requests %d: %+v", sum, res.Requests, res)
	}
}

// TestRunOutcomes drives one server whose prompts each get a different
// behaviour and checks every request lands in the right bucket.
func TestRunOutcomes(t *testing.T) {
	t.Parallel()
	const modes = 9
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		switch n {
		case 0: // good, direct
			send := sse(w, "direct")
			send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
		case 1: // good, queued, a ping and a takeover
			send := sse(w, "queued")
			send(string(protocol.PingFrame))
			send(chunks(1, want[:2]...))
			reset := protocol.AppendIDEvent(nil, 3, protocol.EventReset, []byte(`{"attempt":2}`))
			send(string(reset))
			send(chunks(4, want...) + doneFrame(len(want)+4, "queued"))
		case 2: // cut cleanly: the response ends without a terminal
			send := sse(w, "direct")
			send(chunks(1, want[:2]...))
		case 3: // cut abruptly
			send := sse(w, "direct")
			send(chunks(1, want[:2]...))
			panic(http.ErrAbortHandler)
		case 4: // refused
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			_ = json.NewEncoder(w).Encode((&protocol.Problem{Type: protocol.ProblemTypeBase + protocol.ProblemQueueOverflow, Title: "Queue Overflow", Status: 503, Detail: "full"}))
		case 5: // an explicit error terminal
			send := sse(w, "direct")
			p, _ := json.Marshal((&protocol.Problem{Type: protocol.ProblemTypeBase + protocol.ProblemWorkerLost, Title: "Worker Lost", Status: 503, Detail: "gone"}))
			b := protocol.AppendIDEvent(nil, 2, protocol.EventError, p)
			send(chunks(1, want[0]) + string(b))
		case 6: // wrong content
			send := sse(w, "direct")
			bad := append([]string{}, want...)
			bad[len(bad)-1] += "?"
			send(chunks(1, bad...) + doneFrame(len(bad)+1, "direct"))
		case 7: // 200 that is not an event stream
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "{}")
		case 8: // refusal that is not a problem document
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, "slow down")
		}
	})
	cfg := testConfig(srv.URL)
	cfg.DistinctPrompts = modes
	cfg.Requests = 2 * modes
	var last Snapshot
	var calls int
	res, err := Run(t.Context(), cfg, func(s Snapshot) { last, calls = s, calls+1 })
	if err != nil {
		t.Fatal(err)
	}
	checkTally(t, res)

	counts := []struct {
		name      string
		got, want int
	}{
		{"requests", res.Requests, 18},
		{"done", res.Done, 4},
		{"errors", res.Errors, 2},
		{"refused", res.Refused, 4},
		{"disconnected", res.Disconnected, 0},
		{"aborted", res.Aborted, 0},
		{"lost", res.Lost, 8},
		{"lost no-terminal", res.LostByReason[ReasonNoTerminal], 4},
		{"lost content", res.LostByReason[ReasonContent], 2},
		{"lost bad-response", res.LostByReason[ReasonBadResponse], 2},
		{"worker-lost errors", res.ErrorsByType[protocol.ProblemTypeBase+protocol.ProblemWorkerLost], 2},
		{"pings", res.Pings, 2},
		{"resets", res.Resets, 2},
		{"direct streams", res.Paths["direct"], 10},
		{"streams without path", res.Paths["unknown"], 2},
		{"queued streams", res.Paths["queued"], 2},
		{"direct latencies", res.Latency["direct"].Count, 2},
		{"queued latencies", res.Latency["queued"].Count, 2},
		{"all latencies", res.Latency["all"].Count, 4},
		{"lost samples", len(res.LostSamples), 8},
	}
	for _, c := range counts {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	wantRefusals := []Refusal{
		{Status: 429, Type: RefusalNotProblem, Count: 2, NoRetryAfter: 2},
		{Status: 503, Type: protocol.ProblemTypeBase + protocol.ProblemQueueOverflow, Count: 2, RetryAfterMin: 7, RetryAfterMax: 7},
	}
	if len(res.RefusedBy) != len(wantRefusals) {
		t.Fatalf("refusals %+v, want %+v", res.RefusedBy, wantRefusals)
	}
	for i := range wantRefusals {
		if res.RefusedBy[i] != wantRefusals[i] {
			t.Errorf("refusal %d = %+v, want %+v", i, res.RefusedBy[i], wantRefusals[i])
		}
	}
	for path, l := range res.Latency {
		if l.FirstChunk.P50 <= 0 || l.Total.Max < l.FirstChunk.P50 || l.Total.P99 > l.Total.Max {
			t.Errorf("latency %s = %+v", path, l)
		}
	}
	if calls == 0 || last.Done != res.Done || last.Lost != res.Lost || last.Refused != res.Refused ||
		last.Sent != res.Requests || last.InFlight != 0 {
		t.Errorf("final snapshot %+v after %d calls, result %+v", last, calls, res)
	}
}

func TestRunDisconnectIsNotLost(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "direct")
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	tests := []struct {
		share        float64
		disconnected int
	}{
		{0, 0},
		{0.5, 5},
		{1, 10},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatFloat(tt.share, 'g', -1, 64), func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(srv.URL)
			cfg.Requests = 10
			cfg.DistinctPrompts = 3
			cfg.DisconnectShare = tt.share
			res, err := Run(t.Context(), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkTally(t, res)
			if res.Disconnected != tt.disconnected || res.Done != 10-tt.disconnected || res.Lost != 0 {
				t.Errorf("disconnected %d done %d lost %d %v, want %d, %d, 0",
					res.Disconnected, res.Done, res.Lost, res.LostSamples, tt.disconnected, 10-tt.disconnected)
			}
			if res.Latency["all"].Count != res.Done {
				t.Errorf("latencies of %d streams, want %d done ones", res.Latency["all"].Count, res.Done)
			}
		})
	}
}

// TestRunRequestShape checks what the runner sends: max_tokens (and that
// the expected answer is cut to it), X-User-ID spread and extra headers.
func TestRunRequestShape(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	users := map[string]int{}
	var badHeader, badMax int
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		mu.Lock()
		users[r.Header.Get("X-User-ID")]++
		if r.Header.Get("X-Test") != "yes" {
			badHeader++
		}
		if len(want) != 3 {
			badMax++
		}
		mu.Unlock()
		send := sse(w, "direct")
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	cfg := testConfig(srv.URL)
	cfg.Requests = 9
	cfg.DistinctPrompts = 4
	cfg.MaxTokens = 3
	cfg.UserIDs = 3
	cfg.Headers = map[string]string{"X-Test": "yes", "X-User-ID": "overridden"}
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 9 || res.Lost != 0 {
		t.Errorf("done %d lost %d %v", res.Done, res.Lost, res.LostSamples)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(users) != 3 || users["loadtest-user-0"] != 3 || users["loadtest-user-2"] != 3 {
		t.Errorf("user ids %v", users)
	}
	if badHeader != 0 || badMax != 0 {
		t.Errorf("%d requests without the extra header, %d without max_tokens 3", badHeader, badMax)
	}
}

func TestRunVerifyCatchesOtherSeed(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "direct")
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	cfg := testConfig(srv.URL)
	cfg.Seed = testSeed + 1
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lost != cfg.Requests || res.LostByReason[ReasonContent] != cfg.Requests {
		t.Errorf("lost %d %v, want all %d for content", res.Lost, res.LostByReason, cfg.Requests)
	}
	cfg.Verify = false
	res, err = Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lost != 0 || res.Done != cfg.Requests || res.Verified {
		t.Errorf("without verify: lost %d done %d verified %v", res.Lost, res.Done, res.Verified)
	}
}

func TestRunTimeoutIsLost(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "queued")
		send(chunks(1, want[0]))
		<-r.Context().Done()
	})
	cfg := testConfig(srv.URL)
	cfg.Requests = 2
	cfg.Timeout = 200 * time.Millisecond
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkTally(t, res)
	if res.Lost != 2 || res.LostByReason[ReasonTimeout] != 2 || res.Interrupted {
		t.Errorf("lost %d %v interrupted %v", res.Lost, res.LostByReason, res.Interrupted)
	}
}

func TestRunCancelIsAborted(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 4)
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "queued")
		send(chunks(1, want[0]))
		started <- struct{}{}
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cfg := testConfig(srv.URL)
	cfg.Concurrency = 2
	cfg.Requests = 100
	type ret struct {
		res *Result
		err error
	}
	out := make(chan ret, 1)
	go func() {
		res, err := Run(ctx, cfg, nil)
		out <- ret{res, err}
	}()
	<-started
	<-started
	cancel()
	got := <-out
	if got.err != nil {
		t.Fatal(got.err)
	}
	res := got.res
	checkTally(t, res)
	if res.Aborted != 2 || res.Lost != 0 || res.Requests != 2 || !res.Interrupted {
		t.Errorf("aborted %d lost %d requests %d interrupted %v %v", res.Aborted, res.Lost, res.Requests, res.Interrupted, res.LostSamples)
	}
}

func TestRunTransportErrorIsLost(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := testConfig("http://" + addr + "/v1/stream")
	cfg.Requests = 3
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lost != 3 || res.LostByReason[ReasonTransport] != 3 {
		t.Errorf("lost %d %v", res.Lost, res.LostByReason)
	}
}

func TestRunBoundedByDuration(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "direct")
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	cfg := testConfig(srv.URL)
	cfg.Requests = 0
	cfg.Duration = 150 * time.Millisecond
	cfg.Concurrency = 2
	start := time.Now()
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < cfg.Duration || el > 10*time.Second {
		t.Errorf("run took %v for a %v duration", el, cfg.Duration)
	}
	checkTally(t, res)
	if res.Requests == 0 || res.Done != res.Requests || res.Interrupted {
		t.Errorf("requests %d done %d interrupted %v", res.Requests, res.Done, res.Interrupted)
	}
}

func TestRunThinkTime(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "direct")
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	cfg := testConfig(srv.URL)
	cfg.Concurrency = 1
	cfg.Requests = 3
	cfg.ThinkTime = 50 * time.Millisecond
	start := time.Now()
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// One client pauses after each of its requests but the last, at least.
	if el := time.Since(start); el < 2*cfg.ThinkTime {
		t.Errorf("3 requests with %v think time took %v", cfg.ThinkTime, el)
	}
	if res.Done != 3 {
		t.Errorf("done %d", res.Done)
	}
}

func TestRunSlowReaders(t *testing.T) {
	t.Parallel()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		send := sse(w, "direct")
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	cfg := testConfig(srv.URL)
	cfg.Requests = 4
	cfg.SlowReaderShare = 1
	cfg.SlowReadDelay = time.Millisecond
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 4 || res.Lost != 0 {
		t.Errorf("done %d lost %d %v", res.Done, res.Lost, res.LostSamples)
	}
	if len(res.Latency) != 0 {
		t.Errorf("slow readers in latencies: %+v", res.Latency)
	}
}

// -slowest: the streams with the longest first chunk, longest first, each
// with its client, its place among that client's requests and whether it
// went on a kept-alive connection.
func TestRunSlowest(t *testing.T) {
	t.Parallel()
	const slow = 400 * time.Millisecond // far above a dial on a loaded machine
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int, want []string) {
		if n == 5 || n == 6 {
			<-time.After(slow + time.Duration(n-5)*slow) // prompt 6 the slowest, then 5
		}
		send := sse(w, "direct")
		send(chunks(1, want...) + doneFrame(len(want)+1, "direct"))
	})
	cfg := testConfig(srv.URL)
	cfg.Concurrency = 2
	cfg.Requests = 8
	cfg.DistinctPrompts = 8 // request i sends prompt #i
	cfg.Slowest = 3
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != 8 {
		t.Fatalf("done %d, lost %v", res.Done, res.LostSamples)
	}
	got := res.Slowest
	if len(got) != 3 || got[0].Request != 6 || got[1].Request != 5 {
		t.Fatalf("slowest %+v, want requests 6, 5 and one more", got)
	}
	for i, st := range got {
		if i > 0 && st.FirstMS > got[i-1].FirstMS {
			t.Errorf("slowest not longest first: %+v", got)
		}
		if st.Client < 0 || st.Client >= cfg.Concurrency || st.Seq < 0 || st.Seq > 7 || st.Path != "direct" || st.RequestID != "req-direct" {
			t.Errorf("slowest entry %+v out of range", st)
		}
		if st.Seq == 0 && st.Reused {
			t.Errorf("a client's first request went on a kept-alive connection: %+v", st)
		}
		if st.Seq > 0 && !st.Reused {
			t.Errorf("a client's later request dialled anew: %+v", st)
		}
		if st.FirstMS < ms(slow) && i < 2 || st.TotalMS < st.FirstMS || st.StartMS < 0 {
			t.Errorf("slowest entry %+v: timings inconsistent", st)
		}
	}
	// Without the flag, no list.
	cfg.Slowest = 0
	if res, err = Run(t.Context(), cfg, nil); err != nil || len(res.Slowest) != 0 {
		t.Fatalf("without -slowest: %v, %+v", err, res.Slowest)
	}
}

func TestSlowReader(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		data := bytes.Repeat([]byte("x"), 2*slowReadBytes+10)
		sr := &slowReader{r: bytes.NewReader(data), delay: time.Second, done: make(chan struct{})}
		start := time.Now()
		buf := make([]byte, 4096)
		var got []byte
		reads := 0
		for {
			n, err := sr.Read(buf)
			if n > slowReadBytes {
				t.Fatalf("read %d bytes at once", n)
			}
			got = append(got, buf[:n]...)
			reads++
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("read %d bytes, want %d", len(got), len(data))
		}
		if el := time.Since(start); el != time.Duration(reads)*time.Second {
			t.Errorf("%d reads took %v, want a second each", reads, el)
		}

		done := make(chan struct{})
		close(done)
		sr = &slowReader{r: bytes.NewReader(data), delay: time.Hour, done: done}
		start = time.Now()
		if _, err := sr.Read(buf); !errors.Is(err, errSlowReadCancelled) || time.Since(start) != 0 {
			t.Errorf("cancelled read: %v after %v", err, time.Since(start))
		}
	})
}

func TestPicked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		share float64
		phase float64
		n     int
		want  int
	}{
		{0, 0, 1000, 0},
		{0.1, 0, 1000, 100},
		{0.25, 0.5, 1000, 250},
		{0.5, 0, 10, 5},
		{0.5, 0.5, 10, 5},
		{1, 0, 7, 7},
		{1, 0.5, 7, 7},
		{0.3, 0, 10, 3},
	}
	for _, tt := range tests {
		got := 0
		for i := range tt.n {
			if picked(i, tt.share, tt.phase) {
				got++
			}
		}
		if got != tt.want {
			t.Errorf("picked(share %v, phase %v) %d of %d, want %d", tt.share, tt.phase, got, tt.n, tt.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"", 0, false},
		{"60", 60, true},
		{" 2 ", 2, true},
		{"0", 0, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
	}
	for _, tt := range tests {
		got, ok := parseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseRetryAfter(%q) = %d, %v, want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := testConfig("http://127.0.0.1:8080/v1/stream")
	tests := []struct {
		name   string
		mutate func(*Config)
		valid  bool
	}{
		{"defaults", func(*Config) {}, true},
		{"duration only", func(c *Config) { c.Requests, c.Duration = 0, time.Second }, true},
		{"unbounded", func(c *Config) { c.Requests, c.Duration = 0, 0 }, false},
		{"no scheme", func(c *Config) { c.URL = "127.0.0.1:8080" }, false},
		{"ftp", func(c *Config) { c.URL = "ftp://127.0.0.1/" }, false},
		{"zero concurrency", func(c *Config) { c.Concurrency = 0 }, false},
		{"negative requests", func(c *Config) { c.Requests = -1 }, false},
		{"share above 1", func(c *Config) { c.DisconnectShare = 1.5 }, false},
		{"NaN share", func(c *Config) { c.SlowReaderShare = nan() }, false},
		{"slow without delay", func(c *Config) { c.SlowReaderShare = 0.5 }, false},
		{"verify without tokens", func(c *Config) { c.Tokens = 0 }, false},
		{"no verify no tokens", func(c *Config) { c.Tokens, c.Verify = 0, false }, true},
		{"no timeout", func(c *Config) { c.Timeout = 0 }, false},
		{"bad header name", func(c *Config) { c.Headers = map[string]string{"X Bad": "1"} }, false},
		{"header injection", func(c *Config) { c.Headers = map[string]string{"X-A": "1\r\nX-B: 2"} }, false},
		{"negative users", func(c *Config) { c.UserIDs = -1 }, false},
		{"negative image", func(c *Config) { c.ImageBytes = -1 }, false},
		{"image over a body", func(c *Config) { c.ImageBytes = MaxImageBytes + 1 }, false},
		{"image of 1 MiB", func(c *Config) { c.ImageBytes = 1 << 20 }, true},
		{"openai mode", func(c *Config) { c.Mode = ModeOpenAI }, true},
		{"spillway mode", func(c *Config) { c.Mode = ModeSpillway }, true},
		{"unknown mode", func(c *Config) { c.Mode = "anthropic" }, false},
		{"ramp-up", func(c *Config) { c.RampUp = time.Second }, true},
		{"negative ramp-up", func(c *Config) { c.RampUp = -time.Second }, false},
		{"slowest", func(c *Config) { c.Slowest = 20 }, true},
		{"negative slowest", func(c *Config) { c.Slowest = -1 }, false},
		{"slowest over the bound", func(c *Config) { c.Slowest = MaxSlowest + 1 }, false},
	}
	for _, tt := range tests {
		c := ok
		tt.mutate(&c)
		if err := c.Validate(); (err == nil) != tt.valid {
			t.Errorf("%s: Validate() = %v, want valid %v", tt.name, err, tt.valid)
		}
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

// -image-bytes: every request carries the prompt's text and an inline
// image of the asked size (rounded up to whole base64 quads), with an
// exact Content-Length; the answer still verifies against the text.
func TestRunImageBodies(t *testing.T) {
	t.Parallel()
	const imageBytes = 100_003
	var mu sync.Mutex
	var bad []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		var req struct {
			Messages []struct {
				Content []struct {
					Type     string `json:"type"`
					Text     string `json:"text"`
					ImageURL struct {
						URL string `json:"url"`
					} `json:"image_url"`
				} `json:"content"`
			} `json:"messages"`
		}
		err = json.Unmarshal(body, &req)
		mu.Lock()
		switch {
		case err != nil:
			bad = append(bad, "body: "+err.Error())
		case r.ContentLength != int64(len(body)):
			bad = append(bad, fmt.Sprintf("Content-Length %d, body %d bytes", r.ContentLength, len(body)))
		case len(req.Messages) != 1 || len(req.Messages[0].Content) != 2 || req.Messages[0].Content[1].Type != "image_url":
			bad = append(bad, "want one message of a text part and an image part: "+string(body[:min(len(body), 200)]))
		case len(req.Messages[0].Content[1].ImageURL.URL) != len(imagePrefix)+imageBytes+1:
			bad = append(bad, fmt.Sprintf("image URL of %d bytes", len(req.Messages[0].Content[1].ImageURL.URL)))
		}
		mu.Unlock()
		pr, err := protocol.DecodeChatRequest(body, protocol.DefaultLimits)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		want := llm.SimChunks(pr.Messages, testSeed, testTokens)
		send := sse(w, "queued")
		send(chunks(1, want...) + doneFrame(len(want)+1, "queued"))
	}))
	t.Cleanup(srv.Close)
	cfg := testConfig(srv.URL)
	cfg.ImageBytes = imageBytes
	res, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Done != cfg.Requests || res.Lost != 0 {
		t.Errorf("done %d of %d, lost %d %v", res.Done, cfg.Requests, res.Lost, res.LostSamples)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("%d bad requests, first: %s", len(bad), bad[0])
	}
}
