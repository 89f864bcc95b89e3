package llm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// The timeouts are tested twice: inside a synctest bubble at the real
// default settings (60 s, 30 s) over an in-memory transport, where fake
// time makes a 20-minute answer instant and durations exact; and over real
// sockets at millisecond settings, where the upstream must see the
// connection close.

func contentEvent(s string) string {
	return fmt.Sprintf("data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", s)
}

const doneEvents = "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"

// pause waits d of the bubble's clock, or until ctx ends (false).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// pipeTransport answers every request with a 200 event stream that script
// writes on an in-memory pipe, after headerDelay. Like net/http's
// transport it ends the body when the request's context ends; it records
// that in cancelled.
type pipeTransport struct {
	headerDelay time.Duration
	script      func(ctx context.Context, w io.Writer)
	cancelled   chan struct{}
}

func newPipeTransport(headerDelay time.Duration, script func(ctx context.Context, w io.Writer)) *pipeTransport {
	return &pipeTransport{headerDelay: headerDelay, script: script, cancelled: make(chan struct{})}
}

func (p *pipeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	context.AfterFunc(ctx, func() { close(p.cancelled) }) // one request per transport
	if !pause(ctx, p.headerDelay) {
		return nil, context.Cause(ctx)
	}
	pr, pw := io.Pipe()
	context.AfterFunc(ctx, func() { pw.CloseWithError(context.Cause(ctx)) })
	go func() {
		p.script(ctx, pw)
		if ctx.Err() != nil {
			pw.CloseWithError(context.Cause(ctx))
		}
		pw.Close()
	}()
	return &http.Response{StatusCode: 200, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr, Request: req}, nil
}

// wasCancelled reports whether the upstream saw the request's context end.
func (p *pipeTransport) wasCancelled() bool {
	select {
	case <-p.cancelled:
		return true
	default:
		return false
	}
}

func pipeClient(tb testing.TB, tr http.RoundTripper, cfg llm.OpenAIConfig) *llm.OpenAI {
	tb.Helper()
	cfg.BaseURL = "http://upstream.test/v1"
	cfg.HTTPClient = &http.Client{Transport: tr}
	return newClient(tb, cfg)
}

// every writes ev every interval n times, then the end of the answer.
func every(interval time.Duration, n int, ev func(i int) string) func(context.Context, io.Writer) {
	return func(ctx context.Context, w io.Writer) {
		for i := range n {
			if !pause(ctx, interval) {
				return
			}
			io.WriteString(w, ev(i))
		}
		io.WriteString(w, doneEvents)
	}
}

// TestOpenAILongAnswerNotCut streams a 20-minute answer, a chunk every
// 10 s, at the default timeouts: nothing bounds its total length.
func TestOpenAILongAnswerNotCut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tr := newPipeTransport(0, every(10*time.Second, 120, func(i int) string { return contentEvent(fmt.Sprint(i)) }))
		c := pipeClient(t, tr, llm.OpenAIConfig{})
		start := time.Now()
		got, res, err := stream(t, t.Context(), c, userReq("hi"))
		if err != nil || len(got) != 120 || res.FinishReason != "stop" {
			t.Fatalf("got %d chunks, %+v, %v; want 120 and no error", len(got), res, err)
		}
		if d := time.Since(start); d != 20*time.Minute {
			t.Errorf("answer took %v, want 20m", d)
		}
	})
}

// TestOpenAIIdleTimeoutSynctest stalls after 3 chunks: the call ends
// exactly IdleTimeout after the last one, with ErrIdleTimeout, and the
// upstream sees the request cancelled.
func TestOpenAIIdleTimeoutSynctest(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tr := newPipeTransport(0, func(ctx context.Context, w io.Writer) {
			for i := range 3 {
				io.WriteString(w, contentEvent(fmt.Sprint(i)))
			}
			<-ctx.Done()
		})
		c := pipeClient(t, tr, llm.OpenAIConfig{})
		var last time.Time
		n := 0
		_, err := c.Stream(t.Context(), userReq("hi"), func(protocol.Chunk) error { n++; last = time.Now(); return nil })
		if d := time.Since(last); d != llm.DefaultIdleTimeout {
			t.Errorf("returned %v after the last chunk, want %v", d, llm.DefaultIdleTimeout)
		}
		checkTimeout(t, err, llm.ErrIdleTimeout, false)
		if n != 3 {
			t.Errorf("%d chunks, want 3", n)
		}
		synctest.Wait()
		if !tr.wasCancelled() {
			t.Error("the upstream did not see the request cancelled")
		}
	})
}

// checkTimeout checks err is a retryable *llm.Error wrapping want, not
// mistaken for the caller's cancellation, with the breaker rule given.
func checkTimeout(tb testing.TB, err, want error, countsAgainstBreaker bool) {
	tb.Helper()
	var e *llm.Error
	if !errors.Is(err, want) || !errors.As(err, &e) || !llm.IsRetryable(err) {
		tb.Fatalf("err = %v, want a retryable *llm.Error wrapping %v", err, want)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		tb.Errorf("err %v claims a context error", err)
	}
	if got := llm.CountsAgainstBreaker(err); got != countsAgainstBreaker {
		tb.Errorf("CountsAgainstBreaker(%v) = %v, want %v", err, got, countsAgainstBreaker)
	}
	if got := llm.Reason(err); got != llm.ReasonTimeout {
		tb.Errorf("Reason = %q, want %q", got, llm.ReasonTimeout)
	}
}

// TestOpenAIFirstTokenTimeoutSynctest: the first-token clock runs from
// sending the request, covers slow headers, and is not extended by
// keepalives or a role-only preamble; reasoning output does end it.
func TestOpenAIFirstTokenTimeoutSynctest(t *testing.T) {
	t.Parallel()
	keepalives := func(prefix string) func(context.Context, io.Writer) {
		return func(ctx context.Context, w io.Writer) {
			io.WriteString(w, prefix)
			// Bounded, so that a client fooled by keepalives fails the
			// test instead of running forever.
			for range 120 {
				if !pause(ctx, 5*time.Second) {
					return
				}
				io.WriteString(w, ": keepalive\n\n")
			}
			<-ctx.Done()
		}
	}
	tests := []struct {
		name        string
		headerDelay time.Duration
		script      func(context.Context, io.Writer)
		want        error
		wantAfter   time.Duration
	}{
		{"no headers", time.Hour, nil, llm.ErrFirstTokenTimeout, llm.DefaultFirstTokenTimeout},
		{"headers at 50s then nothing", 50 * time.Second, keepalives(""), llm.ErrFirstTokenTimeout, llm.DefaultFirstTokenTimeout},
		{"keepalives only", 0, keepalives(""), llm.ErrFirstTokenTimeout, llm.DefaultFirstTokenTimeout},
		{"role-only preamble", 0, keepalives("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"),
			llm.ErrFirstTokenTimeout, llm.DefaultFirstTokenTimeout},
		// Reasoning is output: from it on, keepalives keep the call
		// alive, so only a silence would end it. Here the upstream
		// reasons, then falls silent.
		{"reasoning then silence", 0, func(ctx context.Context, w io.Writer) {
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n")
			<-ctx.Done()
		}, llm.ErrIdleTimeout, llm.DefaultIdleTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				tr := newPipeTransport(tc.headerDelay, tc.script)
				c := pipeClient(t, tr, llm.OpenAIConfig{})
				start := time.Now()
				got, _, err := stream(t, t.Context(), c, userReq("hi"))
				if d := time.Since(start); d != tc.wantAfter {
					t.Errorf("returned after %v, want %v", d, tc.wantAfter)
				}
				checkTimeout(t, err, tc.want, tc.want == llm.ErrFirstTokenTimeout)
				if len(got) != 0 {
					t.Errorf("emitted %q", got)
				}
				synctest.Wait()
				if !tr.wasCancelled() {
					t.Error("the upstream did not see the request cancelled")
				}
			})
		})
	}
}

// TestOpenAIIdleResetByKeepalives: after the first chunk, comments keep a
// call alive through a 5-minute pause, and time spent in emit is not
// counted as upstream silence.
func TestOpenAIIdleResetByKeepalives(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tr := newPipeTransport(0, func(ctx context.Context, w io.Writer) {
			io.WriteString(w, contentEvent("a"))
			for range 15 { // 15 × 20 s of keepalives
				if !pause(ctx, 20*time.Second) {
					return
				}
				io.WriteString(w, ": keepalive\n\n")
			}
			io.WriteString(w, contentEvent("b")+contentEvent("c")+doneEvents)
		})
		c := pipeClient(t, tr, llm.OpenAIConfig{})
		var got []string
		_, err := c.Stream(t.Context(), userReq("hi"), func(chunk protocol.Chunk) error {
			s := chunk.Content
			got = append(got, s)
			if s == "b" { // a slow consumer: longer than IdleTimeout per chunk
				<-time.After(2 * llm.DefaultIdleTimeout)
			}
			return nil
		})
		if err != nil || strings.Join(got, "") != "abc" {
			t.Errorf("got %q, %v; want abc and no error", got, err)
		}
	})
}

// TestOpenAITotalTimeout: the optional Timeout cuts a flowing answer with
// ErrTotalTimeout, which does not count against the breaker; before the
// first chunk it is also a first-token timeout, which does.
func TestOpenAITotalTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tr := newPipeTransport(0, every(7*time.Second, 1000, func(int) string { return contentEvent("x") }))
		c := pipeClient(t, tr, llm.OpenAIConfig{Timeout: 5 * time.Minute})
		start := time.Now()
		got, _, err := stream(t, t.Context(), c, userReq("hi"))
		if d := time.Since(start); d != 5*time.Minute || len(got) != 42 {
			t.Errorf("cut after %v and %d chunks, want 5m and 42", d, len(got))
		}
		checkTimeout(t, err, llm.ErrTotalTimeout, false)
		if errors.Is(err, llm.ErrFirstTokenTimeout) {
			t.Errorf("err %v claims a first-token timeout", err)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		tr := newPipeTransport(time.Hour, nil)
		c := pipeClient(t, tr, llm.OpenAIConfig{Timeout: 10 * time.Second})
		_, _, err := stream(t, t.Context(), c, userReq("hi"))
		checkTimeout(t, err, llm.ErrFirstTokenTimeout, true)
		if !errors.Is(err, llm.ErrTotalTimeout) {
			t.Errorf("err %v does not say the call timeout cut it", err)
		}
	})
}

// TestOpenAICallerCancelIsNotTimeout: the caller's cancellation stays a
// context error, not retryable, not a breaker failure.
func TestOpenAICallerCancelIsNotTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		tr := newPipeTransport(0, every(time.Second, 1000, func(int) string { return contentEvent("x") }))
		c := pipeClient(t, tr, llm.OpenAIConfig{})
		ctx, cancel := context.WithTimeout(t.Context(), 5500*time.Millisecond)
		defer cancel()
		_, _, err := stream(t, ctx, c, userReq("hi"))
		if !errors.Is(err, context.DeadlineExceeded) || llm.IsRetryable(err) || llm.CountsAgainstBreaker(err) ||
			llm.Reason(err) != llm.ReasonCancelled {
			t.Errorf("err = %v (reason %q), want the caller's deadline, not retryable, not counted", err, llm.Reason(err))
		}
	})
}

// The same rules over real sockets, at millisecond settings.

// stallingUpstream writes chunks events then keeps the response open
// until the client leaves, which it reports on left.
func stallingUpstream(tb testing.TB, chunks int, interval time.Duration) (url string, left <-chan struct{}) {
	tb.Helper()
	gone := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // lets the server see the client leave
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		rc.Flush()
		for i := range chunks {
			if !pause(r.Context(), interval) {
				break
			}
			io.WriteString(w, contentEvent(fmt.Sprint(i)))
			rc.Flush()
		}
		<-r.Context().Done()
		close(gone)
	}))
	tb.Cleanup(hs.Close)
	return hs.URL + "/v1", gone
}

func TestOpenAIStallOverHTTP(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	url, left := stallingUpstream(t, 3, 10*time.Millisecond)
	c := newClient(t, llm.OpenAIConfig{BaseURL: url, FirstTokenTimeout: time.Second, IdleTimeout: idle})
	var last time.Time
	n := 0
	_, err := c.Stream(t.Context(), userReq("hi"), func(protocol.Chunk) error { n++; last = time.Now(); return nil })
	d := time.Since(last)
	checkTimeout(t, err, llm.ErrIdleTimeout, false)
	if n != 3 || d < idle || d > idle+time.Second {
		t.Errorf("returned %v after chunk %d, want 3 chunks and within [%v, %v]", d, n, idle, idle+time.Second)
	}
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream did not see the client leave")
	}
}

func TestOpenAISlowFirstChunkOverHTTP(t *testing.T) {
	t.Parallel()
	const first = 300 * time.Millisecond
	url, left := stallingUpstream(t, 1, time.Hour)
	c := newClient(t, llm.OpenAIConfig{BaseURL: url, FirstTokenTimeout: first, IdleTimeout: 3 * time.Second})
	start := time.Now()
	_, _, err := stream(t, t.Context(), c, userReq("hi"))
	d := time.Since(start)
	checkTimeout(t, err, llm.ErrFirstTokenTimeout, true)
	if d < first || d > first+time.Second {
		t.Errorf("returned after %v, want within [%v, %v]", d, first, first+time.Second)
	}
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream did not see the client leave")
	}
}

// TestOpenAIFlowingStreamOverHTTP streams 3 s of chunks every 100 ms,
// three times the idle timeout and the first-token timeout: not cut. The
// idle timeout is ten chunk intervals so that a loaded machine's
// scheduling gaps do not pass for an upstream's silence.
func TestOpenAIFlowingStreamOverHTTP(t *testing.T) {
	t.Parallel()
	// 100 ms between chunks against a 2 s idle timeout: a margin a loaded
	// machine under -race keeps (with 1 s it once did not).
	const (
		chunks = 45
		idle   = 2 * time.Second
	)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range chunks {
			if !pause(r.Context(), 100*time.Millisecond) {
				return
			}
			io.WriteString(w, contentEvent(fmt.Sprint(i)))
			rc.Flush()
		}
		io.WriteString(w, doneEvents)
	}))
	t.Cleanup(hs.Close)
	c := newClient(t, llm.OpenAIConfig{BaseURL: hs.URL + "/v1", FirstTokenTimeout: idle, IdleTimeout: idle})
	start := time.Now()
	got, _, err := stream(t, t.Context(), c, userReq("hi"))
	if err != nil || len(got) != chunks {
		t.Fatalf("got %d chunks and %v, want %d and no error", len(got), err, chunks)
	}
	if d := time.Since(start); d < 2*idle {
		t.Errorf("took %v, want at least %v (else the test proves nothing)", d, 2*idle)
	}
}
