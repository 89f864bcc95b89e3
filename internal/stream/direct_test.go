package stream_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// timedSpiller records when each job was spilled and how many slots the
// pool had released by then.
type timedSpiller struct {
	*fakeSpiller
	pool *fakePool
	mu   sync.Mutex
	at   []time.Time
	rel  []int
}

func (s *timedSpiller) Spill(ctx context.Context, job protocol.Job) (failover.Relay, error) {
	_, released := s.pool.state()
	s.mu.Lock()
	s.at = append(s.at, time.Now())
	s.rel = append(s.rel, released)
	s.mu.Unlock()
	return s.fakeSpiller.Spill(ctx, job)
}

func newDirectHandler(tb testing.TB, p *fakePool, prov llm.Provider, sp failover.Spiller, g *fakeGate) *stream.Handler {
	tb.Helper()
	d := stream.Deps{Pool: p, Provider: prov, Gate: g, Log: testutil.DiscardLogger()}
	if sp != nil {
		d.Spiller = sp
	}
	h, err := stream.New(stream.Config{MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		DirectPathEnabled: true}, d)
	if err != nil {
		tb.Fatalf("stream.New: %v", err)
	}
	return h
}

// A direct call throttled before its first chunk is handed to the queue
// on the same response: the slot is freed, the client sees `retrying`,
// the job is enqueued after the upstream's Retry-After (not before), and
// the worker's answer completes the stream.
func TestHandlerDirectHandsThrottledCallToQueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := &fakePool{free: 1}
		relay := newFakeRelay(
			protocol.Result{Kind: protocol.KindHeartbeat},
			protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "Hel"}, {Seq: 2, Content: "lo"}}},
			protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop", Path: protocol.PathQueued}},
		)
		sp := &timedSpiller{fakeSpiller: &fakeSpiller{relay: relay}, pool: p}
		g := &fakeGate{}
		prov := &fakeProvider{err: &llm.Error{Retryable: true, Status: http.StatusTooManyRequests, RetryAfter: 2 * time.Second,
			Err: errors.New("fake: 429")}}
		h := newDirectHandler(t, p, prov, sp, g)

		start := time.Now()
		w := post(h, validBody, map[string]string{"X-User-ID": "u1", "X-Priority": "low"})
		body := w.Body.String()
		var requestID string
		if ids := w.Header()[stream.RequestIDHeader]; len(ids) == 1 {
			requestID = ids[0]
		}
		// Ids count over every event (docs/API.md, "Event ids").
		want := "id: 1\nevent: retrying\ndata: {\"attempt\":2,\"retry_in_seconds\":2,\"reason\":\"throttled\"}\n\n" +
			"id: 2\ndata: {\"content\":\"Hel\"}\n\n" +
			"id: 3\ndata: {\"content\":\"lo\"}\n\n" +
			"id: 4\nevent: done\ndata: {\"request_id\":\"" + requestID + "\",\"finish_reason\":\"stop\",\"path\":\"queued\"}\n\n"
		if w.Code != http.StatusOK || body != want {
			t.Fatalf("HTTP %d body\n%q\nwant\n%q", w.Code, body, want)
		}
		if got := w.Header().Get("X-Stream-Path"); got != protocol.PathDirect {
			t.Errorf("X-Stream-Path %q, want direct: the headers went out before the hand-off", got)
		}
		sp.mu.Lock()
		at, rel := sp.at, sp.rel
		sp.mu.Unlock()
		if len(at) != 1 || at[0].Sub(start) != 2*time.Second {
			t.Fatalf("spilled at %v after the start, want once, after exactly the 2s Retry-After", at)
		}
		if rel[0] != 1 {
			t.Errorf("%d slots released when the job was spilled, want 1: the wait and the queue hold none", rel[0])
		}
		if job := sp.jobs[0]; job.UserID != "user:u1" || job.RequestID != requestID || requestID == "" || len(job.Payload.Messages) != 1 ||
			job.Priority != protocol.PriorityLow {
			t.Errorf("spilled job %+v, want the request's id, user, payload and priority", job)
		}
		if len(g.queuing) != 1 || g.queuing[0] != protocol.PriorityLow {
			t.Errorf("hand-off asked MayQueue for %q, want low once", g.queuing)
		}
		if completed := <-relay.closed; !completed {
			t.Error("relay closed as not completed, want completed: the workers must not be told the client left")
		}
		if _, released := p.state(); released != 1 {
			t.Errorf("slot released %d times, want once", released)
		}
		if len(g.served) != 0 {
			t.Errorf("service times %v reported, want none for a handed-off stream", g.served)
		}
	})
}

// Without a queue the client gets the error event, advising the
// upstream's Retry-After.
func TestHandlerDirectThrottledWithoutQueue(t *testing.T) {
	t.Parallel()
	p := &fakePool{free: 1}
	prov := &fakeProvider{err: &llm.Error{Retryable: true, Status: http.StatusTooManyRequests, RetryAfter: 7 * time.Second}}
	w := post(newDirectHandler(t, p, prov, nil, &fakeGate{}), validBody, nil)
	body := w.Body.String()
	if !strings.Contains(body, "event: error") || !strings.Contains(body, `"retry_after_seconds":7`) || strings.Contains(body, "retrying") {
		t.Fatalf("body %q, want an error event advising 7s and no retrying", body)
	}
}

// An upstream refusal of the request itself is not handed to the queue:
// the client gets provider-rejected at once.
func TestHandlerDirectClientErrorNotHandedOff(t *testing.T) {
	t.Parallel()
	p := &fakePool{free: 1}
	sp := &fakeSpiller{relay: newFakeRelay()}
	prov := &fakeProvider{err: &llm.Error{Status: http.StatusNotFound, Err: errors.New("fake: no such model")}}
	w := post(newDirectHandler(t, p, prov, sp, &fakeGate{}), validBody, nil)
	body := w.Body.String()
	if !strings.Contains(body, "event: error") || !strings.Contains(body, `"type":"https://spillway.dev/errors/provider-rejected"`) ||
		!strings.Contains(body, "HTTP 404") || strings.Contains(body, "retry_after") {
		t.Fatalf("body %q, want a provider-rejected error event naming HTTP 404, advising no retry", body)
	}
	if len(sp.jobs) != 0 {
		t.Errorf("%d jobs spilled, want none", len(sp.jobs))
	}
}

// A failure after the first chunk is not handed off: a retry would repeat
// text the client already has.
func TestHandlerDirectFailureAfterFirstChunkNotHandedOff(t *testing.T) {
	t.Parallel()
	p := &fakePool{free: 1}
	sp := &fakeSpiller{relay: newFakeRelay()}
	prov := &fakeProvider{chunks: []string{"a"}, err: &llm.Error{Retryable: true, Status: http.StatusOK, Err: llm.ErrIdleTimeout}}
	w := post(newDirectHandler(t, p, prov, sp, &fakeGate{}), validBody, nil)
	if body := w.Body.String(); !strings.Contains(body, `provider-error`) || strings.Contains(body, "retrying") {
		t.Fatalf("body %q, want provider-error and no retrying", body)
	}
	if len(sp.jobs) != 0 {
		t.Errorf("%d jobs spilled, want none", len(sp.jobs))
	}
}

// A full queue refuses the hand-off with its own problem.
func TestHandlerDirectHandOffRefusedByFullQueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := &fakePool{free: 1}
		sp := &fakeSpiller{relay: newFakeRelay()}
		prov := &fakeProvider{err: &llm.Error{Retryable: true, Status: http.StatusBadGateway}}
		g := &fakeGate{mayQueue: protocol.QueueOverflow(9)}
		w := post(newDirectHandler(t, p, prov, sp, g), validBody, nil)
		body := w.Body.String()
		if !strings.Contains(body, "event: retrying") || !strings.Contains(body, "queue-overflow") || !strings.Contains(body, `"reason":"server_error"`) {
			t.Fatalf("body %q, want retrying (server_error) then a queue-overflow error", body)
		}
		if len(sp.jobs) != 0 {
			t.Errorf("%d jobs spilled, want none", len(sp.jobs))
		}
	})
}

// Deps.Ended is told once how each request the direct path answered
// itself ended: nil when served, the provider's error when it failed; a
// request handed to the queue is not told here (its worker tells).
func TestHandlerDirectTellsHowRequestsEnded(t *testing.T) {
	t.Parallel()
	errMid := &llm.Error{Retryable: true, Status: http.StatusBadGateway, Err: errors.New("fake: cut")}
	errThrottled := &llm.Error{Retryable: true, Status: http.StatusTooManyRequests, RetryAfter: time.Second, Err: errors.New("fake: 429")}
	tests := []struct {
		name  string
		prov  *fakeProvider
		spill bool
		want  []error
	}{
		{"served", &fakeProvider{chunks: []string{"Hel", "lo"}}, true, []error{nil}},
		{"failed after a chunk", &fakeProvider{chunks: []string{"Hel"}, err: errMid}, true, []error{errMid}},
		{"failed before a chunk, no queue", &fakeProvider{err: errThrottled}, false, []error{errThrottled}},
		{"handed to the queue", &fakeProvider{err: errThrottled}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var ends []error
				d := stream.Deps{Pool: &fakePool{free: 1}, Provider: tt.prov, Gate: &fakeGate{}, Log: testutil.DiscardLogger(),
					Ended: func(err error) {
						mu.Lock()
						ends = append(ends, err)
						mu.Unlock()
					}}
				sp := &fakeSpiller{relay: newFakeRelay(
					protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop", Path: protocol.PathQueued}})}
				if tt.spill {
					d.Spiller = sp
				}
				h, err := stream.New(stream.Config{MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
					DirectPathEnabled: true}, d)
				if err != nil {
					t.Fatal(err)
				}
				w := post(h, validBody, map[string]string{"X-User-ID": "u1"})
				if w.Code != http.StatusOK {
					t.Fatalf("HTTP %d", w.Code)
				}
				h.Wait()
				synctest.Wait()
				if handed := len(sp.jobs) == 1; handed != (tt.spill && tt.want == nil) {
					t.Fatalf("handed to the queue: %v; body %q", handed, w.Body.String())
				}
				mu.Lock()
				defer mu.Unlock()
				if len(ends) != len(tt.want) {
					t.Fatalf("told %v, want %v", ends, tt.want)
				}
				for i := range ends {
					if ends[i] != tt.want[i] {
						t.Errorf("told %v, want %v", ends, tt.want)
					}
				}
			})
		})
	}
}

// After a hand-off the stream reads the relay itself: a relay that gives
// up (a worker lost) ends the stream with its problem, and the relay is
// closed once, as not completed, so the workers are told.
func TestHandlerDirectHandOffRelayGivesUp(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		relay := newFakeRelay(protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "Hel"}}})
		close(relay.done)
		sp := &fakeSpiller{relay: relay}
		prov := &fakeProvider{err: &llm.Error{Retryable: true, Status: http.StatusBadGateway, Err: errors.New("fake: 502")}}
		h := newDirectHandler(t, &fakePool{free: 1}, prov, sp, &fakeGate{})
		w := post(h, validBody, nil)
		body := w.Body.String()
		if !strings.Contains(body, "event: retrying") || !strings.Contains(body, "worker-lost") {
			t.Fatalf("body %q, want retrying, then the relay's worker-lost error", body)
		}
		if completed := <-relay.closed; completed {
			t.Error("relay closed as completed after it gave up")
		}
		h.Wait()
		if len(relay.closed) != 0 {
			t.Error("relay closed twice")
		}
	})
}

// blockingSpiller spills once release closes, whatever its context says:
// a Spill that succeeds as the stream ends.
type blockingSpiller struct {
	*fakeSpiller
	entered, release chan struct{}
}

func (s *blockingSpiller) Spill(ctx context.Context, job protocol.Job) (failover.Relay, error) {
	close(s.entered)
	<-s.release
	return s.fakeSpiller.Spill(ctx, job)
}

// A hand-off whose job is spilled only after the client left (and its
// stream ended) leaves no relay open: the one the stream never read is
// closed as not completed, which tells the workers to skip the job.
func TestHandlerDirectHandOffAfterClientLeftClosesRelay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		relay := newFakeRelay()
		sp := &blockingSpiller{fakeSpiller: &fakeSpiller{relay: relay}, entered: make(chan struct{}), release: make(chan struct{})}
		prov := &fakeProvider{err: &llm.Error{Retryable: true, Status: http.StatusBadGateway, Err: errors.New("fake: 502")}}
		h := newDirectHandler(t, &fakePool{free: 1}, prov, sp, &fakeGate{})
		ctx, leave := context.WithCancel(t.Context())
		r := httptest.NewRequest(http.MethodPost, "/v1/stream", strings.NewReader(validBody)).WithContext(ctx)
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		served := make(chan struct{})
		go func() {
			defer close(served)
			h.ServeHTTP(w, r)
		}()
		<-sp.entered
		leave()
		synctest.Wait() // the stream ended; its handler waits for the hand-off
		select {
		case <-served:
			t.Fatal("the handler returned while its hand-off was still spilling")
		default:
		}
		close(sp.release)
		<-served
		select {
		case completed := <-relay.closed:
			if completed {
				t.Error("relay closed as completed, want not: the client left")
			}
		default:
			t.Fatal("the relay spilled after the stream ended was left open")
		}
	})
}

// A request handed to the queue gives its body's share of
// BODY_BYTES_IN_FLIGHT back once its job is enqueued, while its stream
// still waits for a worker; and exactly once: the handler's own release
// when the stream ends finds nothing left, also when the client left
// while the job was being spilled (a second give would take the count
// below zero, and the semaphore would panic).
func TestHandlerDirectHandOffGivesBodyBack(t *testing.T) {
	t.Parallel()
	for _, leaveDuringSpill := range []bool{false, true} {
		t.Run(fmt.Sprint("client leaves during the spill=", leaveDuringSpill), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				relay := newFakeRelay() // no worker publishes: the stream waits
				sp := &blockingSpiller{fakeSpiller: &fakeSpiller{relay: relay}, entered: make(chan struct{}), release: make(chan struct{})}
				prov := &fakeProvider{err: &llm.Error{Retryable: true, Status: http.StatusBadGateway, Err: errors.New("fake: 502")}}
				h, err := stream.New(stream.Config{MaxBodyBytes: 1024, BodyBytesInFlight: 1024, Limits: protocol.DefaultLimits,
					Heartbeat: time.Hour, DirectPathEnabled: true},
					stream.Deps{Pool: &fakePool{free: 1}, Provider: prov, Spiller: sp, Gate: &fakeGate{}, Log: testutil.DiscardLogger()})
				if err != nil {
					t.Fatal(err)
				}
				ctx, leave := context.WithCancel(t.Context())
				defer leave()
				r := httptest.NewRequest(http.MethodPost, "/v1/stream", strings.NewReader(validBody)).WithContext(ctx)
				r.Header.Set("Content-Type", "application/json")
				served := make(chan struct{})
				go func() {
					defer close(served)
					h.ServeHTTP(httptest.NewRecorder(), r)
				}()
				<-sp.entered
				if got := h.BodyBytesHeld(); got != int64(len(validBody)) {
					t.Fatalf("while the job is spilled: body bytes held %d, want the body's %d", got, len(validBody))
				}
				if leaveDuringSpill {
					leave()
					synctest.Wait()
				}
				close(sp.release)
				synctest.Wait()
				if !leaveDuringSpill {
					select {
					case <-served:
						t.Fatal("the stream ended, want it waiting for a worker")
					default:
					}
					if got := h.BodyBytesHeld(); got != 0 {
						t.Fatalf("job enqueued, stream waiting: body bytes held %d, want 0", got)
					}
					leave()
				}
				<-served
				h.Wait()
				if got := h.BodyBytesHeld(); got != 0 {
					t.Fatalf("after the stream: body bytes held %d, want 0 (given back once)", got)
				}
				if len(sp.jobs) != 1 || len(sp.jobs[0].Payload.Messages) != 1 {
					t.Fatalf("spilled jobs %+v, want the one request with its message", sp.jobs)
				}
			})
		})
	}
}

// lateProvider sends its one chunk once release is closed.
type lateProvider struct{ release chan struct{} }

func (p *lateProvider) Name() string { return "late" }

func (p *lateProvider) Stream(ctx context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	select {
	case <-p.release:
	case <-ctx.Done():
		return llm.Result{}, ctx.Err()
	}
	if err := emit(protocol.Chunk{Content: "late"}); err != nil {
		return llm.Result{}, err
	}
	return llm.Result{FinishReason: "stop"}, nil
}

// A direct stream's headers wait for its first chunk to carry them, but
// not for long: with a provider that has said nothing yet, the client
// still gets the 200 and its headers (after headerHold), then the chunk.
func TestDirectHeadersDoNotWaitForASlowFirstChunk(t *testing.T) {
	t.Parallel()
	prov := &lateProvider{release: make(chan struct{})}
	h, err := stream.New(stream.Config{
		MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		DirectPathEnabled: true, TakeOverAfter: -1,
	}, stream.Deps{Pool: &fakePool{free: 1}, Provider: prov, Gate: &fakeGate{}, Log: testutil.DiscardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	// Were the headers held until the first chunk, Do would wait for a
	// chunk the provider only sends after Do returned: the deadline makes
	// that a clear failure rather than a hung test.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/stream", strings.NewReader(validBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// Do returns once the headers arrived: the provider is still held.
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("no headers before the first chunk: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("X-Stream-Path") != protocol.PathDirect ||
		res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("HTTP %d, path %q, type %q before the first chunk; want 200, direct, text/event-stream",
			res.StatusCode, res.Header.Get("X-Stream-Path"), res.Header.Get("Content-Type"))
	}
	close(prov.release)
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"content":"late"`, "event: done"} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("stream lacks %q: %q", want, body)
		}
	}
}
