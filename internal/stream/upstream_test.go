package stream_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/memqueue"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/testkit/memresults"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// These tests run the handler, and for the queued path the gateway and a
// worker on in-memory queue and result channel, against a mock upstream:
// simllm's OpenAI-compatible server (internal/llm/simserver) on a real
// loopback socket, called by the real OpenAI client with the timeouts
// compressed from seconds to fractions of one. They take real time; each
// stays within a few seconds.

// upstream is a simulated OpenAI-compatible upstream and a client of it.
type upstream struct {
	srv    *simserver.Server
	client *llm.OpenAI
}

func newUpstream(tb testing.TB, sim llm.SimConfig, cfg llm.OpenAIConfig) *upstream {
	tb.Helper()
	s, err := llm.NewSim(sim)
	if err != nil {
		tb.Fatalf("NewSim: %v", err)
	}
	srv := simserver.New(s, testutil.DiscardLogger())
	hs := httptest.NewServer(srv)
	tb.Cleanup(hs.Close)
	cfg.BaseURL = hs.URL + "/v1"
	c, err := llm.NewOpenAI(cfg)
	if err != nil {
		tb.Fatalf("NewOpenAI: %v", err)
	}
	return &upstream{srv: srv, client: c}
}

// system is a handler with a pool of poolSize and, when queued, the queued
// path: gateway, in-memory queue and results, and one running worker.
type system struct {
	h    *stream.Handler
	pool *pool.Local
}

func newSystem(tb testing.TB, up *upstream, poolSize int, queued bool, retry llm.RetryPolicy) *system {
	tb.Helper()
	log := testutil.DiscardLogger()
	// The handler's slots, and the worker's own pool: with poolSize 0 on the
	// handler side every request is queued.
	hp, err := pool.NewLocal(max(poolSize, 1), max(poolSize, 1))
	if err != nil {
		tb.Fatalf("pool.NewLocal: %v", err)
	}
	if poolSize == 0 {
		l, err := hp.TryAcquire(context.Background(), "filler")
		if err != nil {
			tb.Fatalf("fill the pool: %v", err)
		}
		tb.Cleanup(l.Release)
	}
	d := stream.Deps{Pool: hp, Provider: up.client, Log: log}
	if queued {
		res, err := memresults.New(memresults.Config{})
		if err != nil {
			tb.Fatalf("results.NewMemory: %v", err)
		}
		q, err := memqueue.New(memqueue.Config{ReclaimIdle: 15 * time.Second})
		if err != nil {
			tb.Fatalf("memqueue.New: %v", err)
		}
		g, err := gateway.New(gateway.Config{QueueTimeout: 10 * time.Second, WorkerHeartbeat: time.Second, ReclaimIdle: 15 * time.Second},
			gateway.Deps{Producer: q, Results: res, Canceller: res, Log: log})
		if err != nil {
			tb.Fatalf("gateway.New: %v", err)
		}
		wp, err := pool.NewLocal(4, 4)
		if err != nil {
			tb.Fatalf("pool.NewLocal: %v", err)
		}
		w, err := worker.New(worker.Config{Concurrency: 2, Heartbeat: time.Second, BatchSize: 5, BatchTimeout: 20 * time.Millisecond,
			MaxRetries: 3, Retry: retry, QueueTimeout: 10 * time.Second, StopGrace: time.Second},
			worker.Deps{Consumer: q.Consumer("w1"), Pool: wp, Provider: up.client, Results: res, Cancels: res, Log: log})
		if err != nil {
			tb.Fatalf("worker.New: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(ctx) }()
		tb.Cleanup(func() { cancel(); <-done })
		testutil.Eventually(tb, 5*time.Second, func() bool { return res.Watchers() > 0 }, "worker watching cancellations")
		d.Spiller = g
	}
	h, err := stream.New(stream.Config{MaxBodyBytes: 1 << 16, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		DirectPathEnabled: true, Retry: retry}, d)
	if err != nil {
		tb.Fatalf("stream.New: %v", err)
	}
	return &system{h: h, pool: hp}
}

// chunkEvents counts the chunk events of an SSE body.
func chunkEvents(body string) int { return strings.Count(body, "data: {\"content\":") }

// An upstream that falls silent after 3 chunks is cut within the idle
// timeout: the client gets its chunks and an error event within idle
// timeout + 1 s, the upstream sees the request cancelled, and the slot is
// free again.
func TestUpstreamStallEndsWithinIdleTimeout(t *testing.T) {
	t.Parallel()
	const idle = 400 * time.Millisecond
	up := newUpstream(t, llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 5 * time.Millisecond, Tokens: 20, Seed: 1, StallAfter: 3},
		llm.OpenAIConfig{FirstTokenTimeout: 2 * time.Second, IdleTimeout: idle})
	sys := newSystem(t, up, 1, false, llm.RetryPolicy{})

	start := time.Now()
	w := post(sys.h, validBody, nil)
	took := time.Since(start)
	body := w.Body.String()
	if n := chunkEvents(body); n != 3 || !strings.Contains(body, "event: error") || !strings.Contains(body, "provider-error") {
		t.Fatalf("body %q: %d chunks, want 3 and a provider-error event", body, n)
	}
	if took < idle || took > idle+time.Second {
		t.Errorf("stream ended after %v, want between the idle timeout %v and it + 1s", took, idle)
	}
	if st := sys.pool.Stats(); st.InUse != 0 {
		t.Errorf("%d slots in use after the stream, want 0", st.InUse)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return up.srv.Cancelled() == 1 }, "the upstream seeing the stalled request cancelled")
}

// An answer that keeps flowing for longer than the old total timeout
// (LLM_TIMEOUT_SECONDS=120, compressed here to 1 s) is not cut: only the
// silence between chunks is bounded. The same answer with the total
// timeout set is cut, which shows the stream really outlasts it.
func TestUpstreamLongAnswerIsNotCut(t *testing.T) {
	t.Parallel()
	const oldTotal = time.Second
	sim := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 25 * time.Millisecond, Tokens: 70, Seed: 2}
	for _, tt := range []struct {
		name    string
		total   time.Duration
		wantCut bool
	}{{"no total timeout (default)", 0, false}, {"with the old total timeout", oldTotal, true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, sim, llm.OpenAIConfig{FirstTokenTimeout: time.Second, IdleTimeout: 500 * time.Millisecond, Timeout: tt.total})
			sys := newSystem(t, up, 1, false, llm.RetryPolicy{})
			start := time.Now()
			w := post(sys.h, validBody, nil)
			took := time.Since(start)
			body := w.Body.String()
			if tt.wantCut {
				if !strings.Contains(body, "event: error") || chunkEvents(body) >= 70 {
					t.Fatalf("body ends %q: want the total timeout to cut it", body[max(0, len(body)-200):])
				}
				return
			}
			if n := chunkEvents(body); n != 70 || !strings.Contains(body, "event: done") {
				t.Fatalf("%d chunks, body ends %q: want all 70 and done", n, body[max(0, len(body)-200):])
			}
			if took <= oldTotal {
				t.Errorf("answer took %v, want longer than the old total %v for the test to mean anything", took, oldTotal)
			}
		})
	}
}

// An upstream 429 with Retry-After is retried after it, not before, on
// both paths, and the client sees `event: retrying` first.
func TestUpstreamThrottledRetriedAfterRetryAfter(t *testing.T) {
	t.Parallel()
	const retryAfter = time.Second
	for _, tt := range []struct {
		name     string
		poolSize int // 0: every request is queued
	}{{"direct path hands off to the queue", 1}, {"queued path", 0}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 5 * time.Millisecond, Tokens: 6, Seed: 3,
				FailFirst: 1, FailStatus: http.StatusTooManyRequests, FailRetryAfter: retryAfter},
				llm.OpenAIConfig{FirstTokenTimeout: 2 * time.Second, IdleTimeout: time.Second})
			sys := newSystem(t, up, tt.poolSize, true, llm.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond})

			start := time.Now()
			w := post(sys.h, validBody, nil)
			took := time.Since(start)
			body := w.Body.String()
			retrying := strings.Index(body, "event: retrying\ndata: {\"attempt\":2,\"retry_in_seconds\":1,\"reason\":\"throttled\"}")
			first := strings.Index(body, "data: {\"content\":")
			if retrying < 0 || first < retrying || chunkEvents(body) != 6 || !strings.Contains(body, `"path":"queued"`) {
				t.Fatalf("body %q: want a throttled retrying event, then 6 chunks and done from the queue", body)
			}
			if took < retryAfter {
				t.Errorf("answered after %v, before the upstream's Retry-After %v", took, retryAfter)
			}
			if n := up.srv.Requests(); n != 2 {
				t.Errorf("upstream got %d requests, want 2: the 429 and one retry", n)
			}
			if n := up.srv.Throttled(); n != 1 {
				t.Errorf("upstream throttled %d requests, want 1", n)
			}
		})
	}
}
