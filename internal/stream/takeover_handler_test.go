package stream_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// queuedServer serves h over real HTTP/1.1, where a queued stream takes
// its connection over from net/http; accepted connections get a small
// send buffer when small is set.
func queuedServer(tb testing.TB, h http.Handler, small bool) *httptest.Server {
	tb.Helper()
	srv := httptest.NewUnstartedServer(h)
	if small {
		srv.Listener = smallSendBuffer{srv.Listener}
	}
	srv.Start()
	tb.Cleanup(srv.Close)
	return srv
}

type smallSendBuffer struct{ net.Listener }

func (l smallSendBuffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// postRaw sends a /v1/stream request on a connection of its own and
// reads the response head; the body is the caller's to read.
func postRaw(tb testing.TB, srv *httptest.Server) (net.Conn, *http.Response) {
	tb.Helper()
	cn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cn.Close() })
	req := "POST /v1/stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(validBody)) + "\r\n\r\n" + validBody
	if _, err := io.WriteString(cn, req); err != nil {
		tb.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(cn), nil)
	if err != nil {
		tb.Fatal(err)
	}
	return cn, resp
}

// Over a real connection a queued stream's answer arrives whole, and the
// connection closes after it.
func TestHandlerQueuedStreamOverItsOwnConnection(t *testing.T) {
	t.Parallel()
	relay := newFakeRelay(
		protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "queued hi"}}},
		protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop"}},
	)
	h := newHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: &fakeSpiller{relay: relay}, gate: &fakeGate{}})
	srv := queuedServer(t, h, false)
	resp, err := http.Post(srv.URL+"/v1/stream", "application/json", strings.NewReader(validBody))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	if !strings.Contains(string(body), `"content":"queued hi"`) || !strings.Contains(string(body), "event: done") {
		t.Errorf("stream %q lacks the chunk or the done event", body)
	}
	if !resp.Close || resp.Header.Get("X-Stream-Path") != protocol.PathQueued {
		t.Errorf("close %v, path %q: want a queued stream on a connection that closes after it", resp.Close, resp.Header.Get("X-Stream-Path"))
	}
	if completed := <-relay.closed; !completed {
		t.Error("relay closed as incomplete after done")
	}
	h.Wait()
}

// A client that hangs up while its stream waits is seen without
// net/http's reader: the relay is closed as incomplete, at once.
func TestHandlerQueuedClientHangsUp(t *testing.T) {
	t.Parallel()
	relay := newFakeRelay()
	h := newHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: &fakeSpiller{relay: relay}, gate: &fakeGate{}})
	srv := queuedServer(t, h, false)
	cn, resp := postRaw(t, srv)
	if resp.StatusCode != http.StatusOK || !resp.Close {
		t.Fatalf("HTTP %d, close %v: want a queued stream that took its connection", resp.StatusCode, resp.Close)
	}
	cn.Close()
	select {
	case completed := <-relay.closed:
		if completed {
			t.Error("relay closed as completed after the client left")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client's hang-up was not seen")
	}
	h.Wait()
}

// After a drain, Cut ends the streams whose clients stopped reading:
// http.Server.Close no longer sees their connections.
func TestHandlerCutEndsStalledTakenOverStreams(t *testing.T) {
	t.Parallel()
	var rs []protocol.Result
	for i := range 64 {
		rs = append(rs, protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: i + 1, Content: strings.Repeat("x", 32<<10)}}})
	}
	relay := newFakeRelay(rs...)
	h, err := stream.New(stream.Config{
		MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		WriteTimeout:  time.Hour, // only Cut can end the stalled write
		TakeOverAfter: -1,
	}, stream.Deps{Pool: &fakePool{err: pool.ErrPoolExhausted}, Provider: &fakeProvider{}, Gate: &fakeGate{},
		Spiller: &fakeSpiller{relay: relay}, Log: testutil.DiscardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := queuedServer(t, h, true)
	cn, _ := postRaw(t, srv)
	_ = cn.(*net.TCPConn).SetReadBuffer(4096)
	// 2 MiB of chunks cannot fit the two small buffers between the
	// writer and a client that reads nothing more: the write blocks.
	ended := make(chan struct{})
	go func() {
		h.Wait()
		close(ended)
	}()
	h.Drain()
	select {
	case <-ended:
		t.Fatal("a stream stalled in a write ended without Cut")
	default:
	}
	h.Cut()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("Cut did not end the stalled stream")
	}
}

// A streamed OpenAI answer that waits in the queue takes its connection
// over too: an answer that fails before its first byte is still an HTTP
// error with the problem's status and Retry-After, one that succeeds is
// a whole chunked stream.
func TestOpenAIQueuedStreamOverItsOwnConnection(t *testing.T) {
	t.Parallel()
	failed := protocol.QueueTimeout(7)
	for _, tc := range []struct {
		name   string
		relay  *fakeRelay
		status int
	}{
		{"answered", newFakeRelay(
			protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "queued hi"}}},
			protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop"}},
		), http.StatusOK},
		{"failed before its first byte", newFakeRelay(protocol.Result{Kind: protocol.KindError, Problem: failed}), failed.Status},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, h := chatHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{},
				spiller: &fakeSpiller{relay: tc.relay}, gate: &fakeGate{}}, "m")
			srv := queuedServer(t, h, false)
			resp, err := http.Post(srv.URL, "application/json", strings.NewReader(streamBody))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			if resp.StatusCode != tc.status || !resp.Close {
				t.Fatalf("HTTP %d, close %v, body %q: want %d on a connection that closes after it", resp.StatusCode, resp.Close, body, tc.status)
			}
			if tc.status == http.StatusOK {
				if !strings.Contains(string(body), "queued hi") || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
					t.Errorf("answer %q lacks the chunk or [DONE]", body)
				}
				return
			}
			if resp.Header.Get("Retry-After") != "7" || resp.Header.Get("Content-Type") != "application/json" ||
				!strings.Contains(string(body), `"error"`) {
				t.Errorf("error response: Retry-After %q, Content-Type %q, body %q", resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"), body)
			}
		})
	}
}

// A queued stream that gets no worker within TakeOverAfter is taken over
// between two events: its client, which got the head from net/http (with
// keep-alive), reads one unbroken chunked body, and the connection closes
// after it. The stream parks: its handler returns while it waits, and
// Deps.Hold keeps it counted until it ends.
func TestHandlerQueuedStreamTakenOverWhileWaiting(t *testing.T) {
	t.Parallel()
	relay := &fakeRelay{results: make(chan protocol.Result, 2), done: make(chan struct{}), closed: make(chan bool, 1)}
	const heartbeat = 20 * time.Millisecond
	var holds, releases atomic.Int32
	h, err := stream.New(stream.Config{
		MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: heartbeat,
		TakeOverAfter: 2 * heartbeat,
	}, stream.Deps{Pool: &fakePool{err: pool.ErrPoolExhausted}, Provider: &fakeProvider{}, Gate: &fakeGate{},
		Spiller: &fakeSpiller{relay: relay}, Log: testutil.DiscardLogger(),
		Hold: func() func() { holds.Add(1); return func() { releases.Add(1) } }})
	if err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{})
	srv := queuedServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		close(returned)
	}), false)
	cn, resp := postRaw(t, srv)
	if resp.Close || len(resp.TransferEncoding) == 0 {
		t.Fatalf("close %v, transfer encoding %v: the head should come from net/http, chunked, keep-alive", resp.Close, resp.TransferEncoding)
	}
	// Heartbeats are at least 20 ms apart, each after the last write: the
	// tenth is written 200 ms after the stream opened, well past
	// TakeOverAfter, and the takeover happens before a heartbeat's write.
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 10; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading heartbeats: %v", err)
		}
		if strings.HasPrefix(line, ": ping") {
			i++
		}
	}
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler of a stream waiting past TakeOverAfter did not return: the stream did not park")
	}
	if holds.Load() != 1 || releases.Load() != 0 {
		t.Fatalf("parked: %d holds, %d released; want 1 held", holds.Load(), releases.Load())
	}
	relay.results <- protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "late hi"}}}
	relay.results <- protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop"}}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("the body broke at the takeover: %v", err)
	}
	if !strings.Contains(string(rest), `"content":"late hi"`) || !strings.Contains(string(rest), "event: done") {
		t.Errorf("rest of the stream %q lacks the chunk or done", rest)
	}
	// net/http would keep the connection for the next request; the
	// writer that took it over closes it.
	_ = cn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := cn.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("after the stream: read %d bytes, %v; want the connection closed (the stream was not taken over)", n, err)
	}
	if completed := <-relay.closed; !completed {
		t.Error("relay closed as incomplete after done")
	}
	h.Wait()
	if releases.Load() != 1 {
		t.Errorf("%d holds released after the parked stream ended, want 1", releases.Load())
	}
}

// fixedProgress is a queue that never moves: its waiting streams get a
// position tick every second and nothing else.
type fixedProgress struct{}

func (fixedProgress) Progress(context.Context) (handed, waiting int64, err error) { return 0, 1, nil }

// A streamed OpenAI answer sends nothing while it waits (a queue position
// has no form in its dialect): at its first position after TakeOverAfter
// it is taken over before its head and parks. An answer that then fails
// is still a whole HTTP error, one that succeeds a whole stream; neither
// touches the ResponseWriter its handler let go of.
func TestOpenAIAnswerParksBeforeItsHead(t *testing.T) {
	t.Parallel()
	failed := protocol.QueueTimeout(7)
	for _, tc := range []struct {
		name   string
		last   protocol.Result
		status int
	}{
		{"answered", protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop"}}, http.StatusOK},
		{"failed before its first byte", protocol.Result{Kind: protocol.KindError, Problem: failed}, failed.Status},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			relay := &fakeRelay{results: make(chan protocol.Result, 2), done: make(chan struct{}), closed: make(chan bool, 1)}
			h, err := stream.New(stream.Config{
				MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
				TakeOverAfter: time.Millisecond,
			}, stream.Deps{Pool: &fakePool{err: pool.ErrPoolExhausted}, Provider: &fakeProvider{}, Gate: &fakeGate{},
				Spiller: &fakeSpiller{relay: relay}, Log: testutil.DiscardLogger(), Positions: fixedProgress{}})
			if err != nil {
				t.Fatal(err)
			}
			o := stream.NewOpenAI(h, []string{"m"})
			returned := make(chan struct{})
			srv := queuedServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				o.ChatCompletions(w, r)
				close(returned)
			}), false)
			type answer struct {
				resp *http.Response
				body []byte
				err  error
			}
			got := make(chan answer, 1)
			go func() {
				resp, err := http.Post(srv.URL, "application/json", strings.NewReader(streamBody))
				if err != nil {
					got <- answer{err: err}
					return
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				got <- answer{resp, body, err}
			}()
			select {
			case <-returned:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler of a waiting OpenAI answer did not return: it did not park")
			}
			if tc.status == http.StatusOK {
				relay.results <- protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "parked hi"}}}
			}
			relay.results <- tc.last
			a := <-got
			if a.err != nil {
				t.Fatalf("reading the answer: %v", a.err)
			}
			if a.resp.StatusCode != tc.status || !a.resp.Close {
				t.Fatalf("HTTP %d, close %v, body %q: want %d on a connection that closes after it", a.resp.StatusCode, a.resp.Close, a.body, tc.status)
			}
			if tc.status == http.StatusOK {
				if !strings.Contains(string(a.body), "parked hi") || !strings.HasSuffix(string(a.body), "data: [DONE]\n\n") ||
					a.resp.Header.Get("Content-Type") != "text/event-stream" {
					t.Errorf("answer %q (Content-Type %q) lacks the chunk or [DONE]", a.body, a.resp.Header.Get("Content-Type"))
				}
			} else if a.resp.Header.Get("Retry-After") != "7" || !strings.Contains(string(a.body), `"error"`) {
				t.Errorf("error response: Retry-After %q, body %q", a.resp.Header.Get("Retry-After"), a.body)
			}
			h.Wait()
		})
	}
}
