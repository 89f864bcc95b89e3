package stream

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// writeWaitingStream writes what a queued stream writes: its head and
// first position under a hold, a heartbeat, chunks and, when done, the
// terminal event.
func writeWaitingStream(tb testing.TB, sw *Writer, done bool) {
	tb.Helper()
	sw.Hold()
	check := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatal(err)
		}
	}
	check(sw.Start("req-1", protocol.PathQueued))
	check(sw.Event(Event{ID: 1, Name: protocol.EventQueued, Queued: &protocol.Queued{Position: 3}}.encoded()))
	check(sw.Flush())
	check(sw.Ping())
	check(sw.Event(Event{ID: 2, Content: "héllo\nworld"}))
	sw.Hold()
	check(sw.Event(Event{ID: 3, Content: strings.Repeat("x", 5000)}))
	check(sw.Event(Event{ID: 4, Content: "!"}))
	check(sw.Flush())
	if done {
		check(sw.Event(Event{ID: 5, Name: protocol.EventDone, Done: &protocol.Done{RequestID: "req-1", Path: protocol.PathQueued, FinishReason: "stop"}}.encoded()))
	}
}

// postTakenOver serves one stream written by writeWaitingStream on a
// connection its writer took over, and returns the client's response, its
// body, the writer's write count and the error the body's read ended with.
func postTakenOver(tb testing.TB, done bool) (resp *http.Response, body []byte, writes int, readErr error) {
	tb.Helper()
	flushes := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "https://chat.example.com") // a middleware's
		sw := NewWriter(w, time.Second)
		if _, ok := sw.takeOver(r); !ok {
			tb.Error("takeOver refused an HTTP/1.1 connection")
			close(flushes)
			return
		}
		defer sw.finish()
		writeWaitingStream(tb, sw, done)
		flushes <- sw.Flushes()
	}))
	defer srv.Close()
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, readErr = io.ReadAll(resp.Body)
	return resp, body, <-flushes, readErr
}

// A taken-over stream reaches an HTTP client as the same response net/http
// would have sent, byte for byte in its body, with a chunked body that
// ends properly and "Connection: close".
func TestTakeOverSendsWhatNetHTTPWould(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	writeWaitingStream(t, NewWriter(rec, time.Second), true)
	want := rec.Body.String()

	resp, body, writes, err := postTakenOver(t, true)
	if err != nil {
		t.Fatalf("reading the body: %v (a chunked body must end with its last chunk)", err)
	}
	if string(body) != want {
		t.Errorf("body differs from net/http's:\n got %q\nwant %q", body, want)
	}
	for k, v := range map[string]string{
		"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no",
		RequestIDHeader: "req-1", "X-Stream-Path": protocol.PathQueued,
		"Access-Control-Allow-Origin": "https://chat.example.com",
	} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if resp.StatusCode != http.StatusOK || !resp.Close || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Errorf("status %d, close %v, transfer encoding %v; want 200, close, chunked", resp.StatusCode, resp.Close, resp.TransferEncoding)
	}
	if resp.Header.Get("Date") == "" {
		t.Error("no Date header")
	}
	// Head and first position in one write, then the ping, the first
	// chunk, the two held chunks together, the done event.
	if writes != 5 {
		t.Errorf("%d writes, want 5", writes)
	}
}

// A stream cut before its terminal event is not mistaken for a complete
// one: without the last chunk, the client's read fails.
func TestTakeOverCutIsAnError(t *testing.T) {
	t.Parallel()
	_, body, _, err := postTakenOver(t, false)
	if err == nil {
		t.Fatalf("a cut stream read as complete: %q", body)
	}
	if !strings.Contains(string(body), "héllo") {
		t.Errorf("the events before the cut are missing: %q", body)
	}
}

// A client that hangs up is seen at once, with no read of our own.
func TestTakeOverSeesTheClientLeave(t *testing.T) {
	t.Parallel()
	gone := make(chan (<-chan struct{}), 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := NewWriter(w, time.Second)
		g, ok := sw.takeOver(r)
		if !ok {
			t.Error("takeOver refused")
			close(gone)
			return
		}
		defer sw.finish()
		_ = sw.Start("req-1", protocol.PathQueued)
		gone <- g
		<-release
	}))
	defer srv.Close()
	defer close(release)

	cn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(cn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	// The head is there; the body is left unread (closing it would read
	// it to its end, which never comes).
	if _, err := http.ReadResponse(bufio.NewReader(cn), nil); err != nil {
		t.Fatal(err)
	}
	g, ok := <-gone
	if !ok {
		return
	}
	select {
	case <-g:
		t.Fatal("gone before the client left")
	default:
	}
	cn.Close()
	select {
	case <-g:
	case <-time.After(5 * time.Second):
		t.Fatal("the client's hang-up was not seen")
	}
}

// Where the connection cannot be taken over, the stream stays with
// net/http.
func TestTakeOverRefused(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/v1/stream", nil)
	if _, ok := NewWriter(httptest.NewRecorder(), time.Second).takeOver(r); ok {
		t.Error("took over a ResponseWriter without Hijack")
	}
	refused := make(chan bool, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := NewWriter(w, time.Second)
		_, ok := sw.takeOver(r)
		refused <- !ok
		_ = sw.Start("req-1", protocol.PathQueued)
	}))
	defer srv.Close()
	cn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	if _, err := io.WriteString(cn, "POST / HTTP/1.0\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	if !<-refused {
		t.Error("took over an HTTP/1.0 connection, which cannot carry a chunked body")
	}
}
