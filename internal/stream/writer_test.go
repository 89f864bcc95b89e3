package stream

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func TestWriterGoldenAndOneFlushPerEvent(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	sw := NewWriter(rec, time.Second)
	steps := []func() error{
		func() error { return sw.Start("req-1", "queued") },
		func() error { return sw.Event(Event{ID: 1, Content: "Hel"}.encoded()) },
		func() error { return sw.Ping() },
		func() error {
			return sw.Event(Event{ID: 2, Name: protocol.EventReset, Reset: &protocol.Reset{Attempt: 2}}.encoded())
		},
		func() error {
			return sw.Event(Event{ID: 3, Name: protocol.EventRetrying, Retrying: &protocol.Retrying{Attempt: 2, RetryInSeconds: 20, Reason: "throttled"}}.encoded())
		},
		func() error { return sw.Event(Event{ID: 4, Content: "line\nbreak\r\x00"}.encoded()) },
		func() error {
			return sw.Event(Event{ID: 5, Name: protocol.EventDone, Done: &protocol.Done{RequestID: "req-1", FinishReason: "stop", Path: "queued",
				Usage: &protocol.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}}}.encoded())
		},
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if sw.Flushes() != i+1 {
			t.Fatalf("after step %d: %d flushes, want %d", i, sw.Flushes(), i+1)
		}
	}
	want := "id: 1\ndata: {\"content\":\"Hel\"}\n\n" +
		": ping\n\n" +
		"id: 2\nevent: reset\ndata: {\"attempt\":2}\n\n" +
		"id: 3\nevent: retrying\ndata: {\"attempt\":2,\"retry_in_seconds\":20,\"reason\":\"throttled\"}\n\n" +
		"id: 4\ndata: {\"content\":\"line\\nbreak\\r\\u0000\"}\n\n" +
		"id: 5\nevent: done\ndata: {\"request_id\":\"req-1\",\"finish_reason\":\"stop\",\"path\":\"queued\",\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\n"
	if got := rec.Body.String(); got != want {
		t.Fatalf("wire:\n%q\nwant\n%q", got, want)
	}
	h := rec.Header()
	for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
		"X-Accel-Buffering": "no", "X-Stream-Path": "queued"} {
		if h.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, h.Get(k), v)
		}
	}
	// Written with docs/API.md's spelling, once.
	if got := h["X-Request-ID"]; len(got) != 1 || got[0] != "req-1" || len(h["X-Request-Id"]) != 0 {
		t.Errorf("request id header %v / %v, want exactly X-Request-ID: req-1", h["X-Request-ID"], h["X-Request-Id"])
	}
	if err := sw.Event(Event{ID: 5, Content: "late"}.encoded()); err != ErrTerminated {
		t.Fatalf("write after done: %v, want ErrTerminated", err)
	}
	if err := sw.Event(errorEvent(6, protocol.StreamFailed())); err != ErrTerminated {
		t.Fatalf("second terminal: %v, want ErrTerminated", err)
	}
}

func TestWriterErrorEvent(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	sw := NewWriter(rec, 0)
	p := (&protocol.Problem{Type: protocol.ProblemTypeBase + protocol.ProblemQueueTimeout, Title: "Queue Timeout", Status: 503, Detail: "No worker started the job in time."}).WithRetryAfter(2)
	if err := sw.Event(errorEvent(7, p)); err != nil {
		t.Fatal(err)
	}
	want := "id: 7\nevent: error\ndata: {\"type\":\"https://spillway.dev/errors/queue-timeout\",\"title\":\"Queue Timeout\",\"status\":503,\"detail\":\"No worker started the job in time.\",\"retry_after_seconds\":2}\n\n"
	if rec.Body.String() != want {
		t.Fatalf("got %q\nwant %q", rec.Body.String(), want)
	}
	if !sw.Terminated() {
		t.Fatal("not terminated after error")
	}
}

// lockedRecorder is a ResponseWriter whose body the test may read while
// the handler goroutine writes.
type lockedRecorder struct {
	mu  sync.Mutex
	rec *httptest.ResponseRecorder
}

func newLockedRecorder() *lockedRecorder { return &lockedRecorder{rec: httptest.NewRecorder()} }

func (l *lockedRecorder) Header() http.Header { return l.rec.Header() }
func (l *lockedRecorder) WriteHeader(code int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rec.WriteHeader(code)
}
func (l *lockedRecorder) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.Write(b)
}
func (l *lockedRecorder) Flush() {}
func (l *lockedRecorder) Body() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec.Body.String()
}

// advance moves a synctest bubble's fake clock forward by d and waits for
// every goroutine in it to block again.
func advance(d time.Duration) {
	testutil.AdvanceFakeClock(d) // inside synctest this only advances the fake clock
	synctest.Wait()
}

func newTestHandler(tb testing.TB, heartbeat time.Duration) *Handler {
	tb.Helper()
	h := &Handler{
		cfg:      Config{Heartbeat: heartbeat}, // no write deadline: a recorder has none
		m:        metrics.New(prometheus.NewRegistry()),
		log:      testutil.DiscardLogger(),
		draining: make(chan struct{}),
	}
	return h
}

// Heartbeats come every interval while nothing else is sent, and the timer
// restarts after each event.
func TestHeartbeatTimerResetsAfterEachWrite(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newTestHandler(t, 15*time.Second)
		rec := newLockedRecorder()
		frames := make(chan protocol.Result)
		start := time.Now()
		type result struct {
			outcome string
			body    string
		}
		out := make(chan result)
		go func() {
			s := h.newSession(rec, "r", "u", protocol.PathDirect, start)
			s.src.frames = frames
			o, _ := s.serve(t.Context())
			out <- result{o, rec.Body()}
		}()
		advance(14 * time.Second)
		if strings.Contains(rec.Body(), "ping") {
			t.Fatal("ping before the interval")
		}
		frames <- protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "a"}}}
		advance(14 * time.Second) // 28s since start, 14s since the chunk
		if strings.Contains(rec.Body(), "ping") {
			t.Fatal("ping 14s after a chunk: the timer was not reset")
		}
		advance(2 * time.Second) // 16s since the chunk
		if n := strings.Count(rec.Body(), ": ping\n\n"); n != 1 {
			t.Fatalf("%d pings 16s after the chunk, want 1", n)
		}
		advance(15 * time.Second)
		if n := strings.Count(rec.Body(), ": ping\n\n"); n != 2 {
			t.Fatalf("%d pings after two intervals, want 2", n)
		}
		frames <- protocol.Result{Kind: protocol.KindDone}
		r := <-out
		if r.outcome != OutcomeDone {
			t.Fatalf("outcome %s", r.outcome)
		}
		if !strings.HasSuffix(r.body, "id: 2\nevent: done\ndata: {\"request_id\":\"r\",\"finish_reason\":\"stop\",\"path\":\"direct\"}\n\n") {
			t.Fatalf("body ends %q", r.body)
		}
	})
}

// Drain ends an open stream with a shutting-down error event.
func TestDrainEndsStreamWithError(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		h := newTestHandler(t, time.Hour)
		rec := httptest.NewRecorder()
		out := make(chan string)
		go func() {
			s := h.newSession(rec, "r", "u", protocol.PathQueued, time.Now())
			s.src.frames = make(chan protocol.Result)
			o, _ := s.serve(t.Context())
			out <- o
		}()
		synctest.Wait()
		h.Drain()
		if o := <-out; o != OutcomeError {
			t.Fatalf("outcome %s, want error", o)
		}
		if !strings.Contains(rec.Body.String(), "id: 1\nevent: error\ndata: {\"type\":\"https://spillway.dev/errors/shutting-down\"") {
			t.Fatalf("body %q", rec.Body.String())
		}
	})
}

// writeCounter is a ResponseWriter that records each write and flush.
type writeCounter struct {
	h       http.Header
	writes  []string
	flushes int
	failAt  int // the write, counted from 1, that fails; 0: none
}

func (c *writeCounter) Header() http.Header { return c.h }
func (c *writeCounter) WriteHeader(int)     {}
func (c *writeCounter) Flush()              { c.flushes++ }
func (c *writeCounter) Write(b []byte) (int, error) {
	c.writes = append(c.writes, string(b))
	if len(c.writes) == c.failAt {
		return 0, errors.New("client gone")
	}
	return len(b), nil
}

// Between Hold and Flush the writer gathers events into one write and one
// flush, byte for byte what they would have been one by one; a terminal
// event goes out at once with what was gathered.
func TestWriterHoldCoalesces(t *testing.T) {
	t.Parallel()
	one := &writeCounter{h: http.Header{}}
	sw := NewWriter(one, 0)
	held := &writeCounter{h: http.Header{}}
	hw := NewWriter(held, 0)
	hw.Hold()
	for i := range int64(5) {
		for _, w := range []*Writer{sw, hw} {
			if err := w.Event(Event{ID: i + 1, Content: fmt.Sprint("c", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(held.writes) != 0 || held.flushes != 0 {
		t.Fatalf("held writer wrote %d times, flushed %d times before Flush", len(held.writes), held.flushes)
	}
	if err := hw.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(held.writes) != 1 || held.flushes != 1 || len(one.writes) != 5 {
		t.Fatalf("held: %d writes %d flushes; one by one: %d writes; want 1, 1, 5", len(held.writes), held.flushes, len(one.writes))
	}
	if held.writes[0] != strings.Join(one.writes, "") {
		t.Fatalf("held bytes %q differ from one by one %q", held.writes[0], one.writes)
	}
	hw.Hold()
	_ = hw.Event(Event{ID: 6, Content: "last"})
	if err := hw.Event(Event{ID: 7, Name: protocol.EventDone, Done: &protocol.Done{RequestID: "r", FinishReason: "stop", Path: "direct"}}.encoded()); err != nil {
		t.Fatal(err)
	}
	if len(held.writes) != 2 || !strings.HasPrefix(held.writes[1], "id: 6\n") || !strings.Contains(held.writes[1], "event: done") {
		t.Fatalf("terminal event under hold: writes %q, want the chunk and done in one", held.writes)
	}
}

// The write loop sends every frame that is ready at the same moment in
// one write and one flush: ten chunks and done queued before the stream
// starts reach a direct stream's client in one write and one flush, the
// headers included (Writer.StartLazy). A write that fails is a lost
// client, as without coalescing.
func TestSessionCoalescesReadyFrames(t *testing.T) {
	t.Parallel()
	h := newTestHandler(t, time.Hour)
	w := &writeCounter{h: http.Header{}}
	frames := make(chan protocol.Result, 16)
	for i := range 10 {
		frames <- protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: i + 1, Content: fmt.Sprint("t", i)}}}
	}
	frames <- protocol.Result{Kind: protocol.KindDone}
	s := h.newSession(w, "r", "u", protocol.PathDirect, time.Now())
	s.src.frames = frames
	if o, _ := s.serve(t.Context()); o != OutcomeDone {
		t.Fatalf("outcome %s, want done", o)
	}
	if len(w.writes) != 1 || w.flushes != 1 {
		t.Fatalf("%d writes, %d flushes (headers included); want 1 and 1: %q", len(w.writes), w.flushes, w.writes)
	}
	for i := range 10 {
		if !strings.Contains(w.writes[0], fmt.Sprintf("id: %d\ndata: {\"content\":\"t%d\"}\n\n", i+1, i)) {
			t.Fatalf("chunk %d missing from %q", i, w.writes[0])
		}
	}
	if !strings.HasSuffix(w.writes[0], "id: 11\nevent: done\ndata: {\"request_id\":\"r\",\"finish_reason\":\"stop\",\"path\":\"direct\"}\n\n") {
		t.Fatalf("write does not end with done: %q", w.writes[0])
	}

	// Chunks only: one write when they are ready, and a failed write ends
	// the stream as cancelled (no resume window).
	w = &writeCounter{h: http.Header{}, failAt: 1}
	frames = make(chan protocol.Result, 16)
	for i := range 5 {
		frames <- protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: i + 1, Content: "x"}}}
	}
	s = h.newSession(w, "r2", "u", protocol.PathDirect, time.Now())
	s.src.frames = frames
	if o, _ := s.serve(t.Context()); o != OutcomeCancelled {
		t.Fatalf("outcome %s after a failed write, want cancelled", o)
	}
	if len(w.writes) != 1 {
		t.Fatalf("%d writes, want the one that failed", len(w.writes))
	}
}

// failingFlush is a connection's writer whose flush fails once err is
// set, as net/http's does after a write deadline passed: Flush drops the
// error, FlushError reports it.
type failingFlush struct {
	*httptest.ResponseRecorder
	err error
}

func (w *failingFlush) Flush()            { _ = w.FlushError() }
func (w *failingFlush) FlushError() error { return w.err }

// gin's writer implements only http.Flusher, so ResponseController.Flush
// stops there and a failed flush looks like a success; the Writer must
// still see the error, or a stalled reader passes for one that took the
// event.
func TestWriterSeesFlushErrorBehindGin(t *testing.T) {
	t.Parallel()
	inner := &failingFlush{ResponseRecorder: httptest.NewRecorder()}
	c, _ := gin.CreateTestContext(inner)
	sw := NewWriter(c.Writer, time.Second)
	if err := sw.Start("req-1", "queued"); err != nil {
		t.Fatalf("start: %v", err)
	}
	if err := sw.Event(Event{ID: 1, Content: "x"}.encoded()); err != nil {
		t.Fatalf("event: %v", err)
	}
	// The recorder takes the bytes; only the flush fails.
	inner.err = &net.OpError{Op: "write", Net: "tcp", Err: os.ErrDeadlineExceeded}
	err := sw.Event(Event{ID: 2, Content: "y"}.encoded())
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("event whose flush timed out: %v, want a timeout error", err)
	}
	// A writer that reports flush errors itself is flushed as it is.
	if ef := innerErrFlusher(inner); ef != nil {
		t.Fatalf("innerErrFlusher of a writer with FlushError = %T, want nil", ef)
	}
}

// A gather that outgrows the stream's own buffer (a fast upstream's
// chunks) goes out in one write, its bytes in order, from a pooled buffer
// that is given back once written: the next gather is in the stream's own
// buffer again, which never grew, and a later big gather carries no byte
// of an earlier one.
func TestWriterGatherOutgrowsItsBuffer(t *testing.T) {
	t.Parallel()
	one := &writeCounter{h: http.Header{}}
	sw := NewWriter(one, 0)
	held := &writeCounter{h: http.Header{}}
	hw := NewWriter(held, 0)
	id := int64(0)
	for round, n := range []int{60, 3, 40, 60} {
		hw.Hold()
		for i := range n {
			id++
			e := Event{ID: id, Content: strings.Repeat(string(rune('a'+round)), 150) + fmt.Sprint(i)}
			if err := sw.Event(e); err != nil {
				t.Fatal(err)
			}
			if err := hw.Event(e); err != nil {
				t.Fatal(err)
			}
		}
		if big := hw.big != nil; big != (n*170 > eventBuf) {
			t.Fatalf("round %d: %d chunks gathered in a big buffer: %v", round, n, big)
		}
		if err := hw.Flush(); err != nil {
			t.Fatal(err)
		}
		if hw.big != nil || cap(hw.buf) > eventBuf || len(hw.buf) != 0 {
			t.Fatalf("round %d: after the write, big buffer %v, own buffer %d of %d bytes", round, hw.big != nil, len(hw.buf), cap(hw.buf))
		}
		got, want := held.writes[len(held.writes)-1], strings.Join(one.writes[len(one.writes)-n:], "")
		if got != want {
			t.Fatalf("round %d: gathered write of %d bytes differs from the events one by one (%d bytes)", round, len(got), len(want))
		}
	}
}

// deadlineRecorder is a ResponseWriter that records the write deadlines
// set on it and, for each write, how long was left before the deadline.
type deadlineRecorder struct {
	*httptest.ResponseRecorder
	deadline time.Time
	sets     int
	left     []time.Duration // at each write
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.deadline = t
	d.sets++
	return nil
}

func (d *deadlineRecorder) Write(b []byte) (int, error) {
	d.left = append(d.left, time.Until(d.deadline))
	return d.ResponseRecorder.Write(b)
}

// Every write starts with at least the write timeout before the
// connection's deadline, which is moved only when less than that is left:
// not once per event.
func TestWriteDeadlineMovedOnlyWhenShort(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Second
		rec := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
		sw := NewWriter(rec, timeout)
		if err := sw.Start("req-1", "direct"); err != nil {
			t.Fatalf("start: %v", err)
		}
		id := int64(0)
		events := func(n int) {
			t.Helper()
			for range n {
				id++
				if err := sw.Event(Event{ID: id, Content: "x"}); err != nil {
					t.Fatalf("event %d: %v", id, err)
				}
			}
		}
		events(50)
		if rec.sets != 1 {
			t.Fatalf("%d deadlines set for 50 events at one moment, want 1", rec.sets)
		}
		advance(timeout / 8) // 11.25 s left: not moved
		events(10)
		if rec.sets != 1 {
			t.Fatalf("%d deadlines set with 11.25 s left, want 1", rec.sets)
		}
		advance(timeout / 4) // 8.75 s left: moved
		events(10)
		if rec.sets != 2 {
			t.Fatalf("%d deadlines set with 8.75 s left, want 2", rec.sets)
		}
		advance(time.Minute) // long past: moved
		events(1)
		if rec.sets != 3 {
			t.Fatalf("%d deadlines set a minute later, want 3", rec.sets)
		}
		for i, left := range rec.left {
			if left < timeout || left > timeout+timeout/4 {
				t.Fatalf("write %d began %s before its deadline, want %s to %s", i, left, timeout, timeout+timeout/4)
			}
		}
		if len(rec.left) != int(id) {
			t.Fatalf("%d writes for %d events", len(rec.left), id)
		}
	})
}

// After StartLazy, Start keeps the status and headers: the first event
// carries them in its write and flush, or FlushHeader sends them alone.
func TestWriterStartLazy(t *testing.T) {
	t.Parallel()
	w := &writeCounter{h: http.Header{}}
	sw := NewWriter(w, 0)
	sw.StartLazy()
	if err := sw.Start("r", protocol.PathDirect); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 0 || w.flushes != 0 || !sw.HeaderPending() {
		t.Fatalf("after a lazy Start: %d writes, %d flushes, pending %v; want none and pending", len(w.writes), w.flushes, sw.HeaderPending())
	}
	if err := sw.Event(Event{ID: 1, Content: "a"}); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 1 || w.flushes != 1 || sw.HeaderPending() {
		t.Fatalf("after the first event: %d writes, %d flushes, pending %v; want 1, 1, false", len(w.writes), w.flushes, sw.HeaderPending())
	}
	if err := sw.FlushHeader(); err != nil || w.flushes != 1 {
		t.Fatalf("FlushHeader after the headers went: err %v, %d flushes; want nil and 1", err, w.flushes)
	}

	alone := &writeCounter{h: http.Header{}}
	sw = NewWriter(alone, 0)
	sw.StartLazy()
	if err := sw.Start("r", protocol.PathDirect); err != nil {
		t.Fatal(err)
	}
	if err := sw.FlushHeader(); err != nil {
		t.Fatal(err)
	}
	if len(alone.writes) != 0 || alone.flushes != 1 || sw.HeaderPending() {
		t.Fatalf("FlushHeader: %d writes, %d flushes, pending %v; want 0, 1, false", len(alone.writes), alone.flushes, sw.HeaderPending())
	}
	if got := alone.h.Get("X-Stream-Path"); got != protocol.PathDirect {
		t.Fatalf("X-Stream-Path %q, want direct", got)
	}
}
