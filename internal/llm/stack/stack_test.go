package stack

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/llm/breaker"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// scripted answers "ok", or fails with err while it is set; it counts its
// calls and whether the last one was asked to wait for capacity.
type scripted struct {
	err    atomic.Pointer[llm.Error]
	calls  atomic.Int64
	waited atomic.Bool
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Stream(ctx context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	s.calls.Add(1)
	s.waited.Store(llm.CapacityWait(ctx))
	if e := s.err.Load(); e != nil {
		return llm.Result{}, e
	}
	if err := emit(protocol.Chunk{Content: "ok"}); err != nil {
		return llm.Result{}, err
	}
	return llm.Result{FinishReason: "stop"}, nil
}

func newDeps(tb testing.TB, p llm.Provider) (Deps, *metrics.Metrics) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	return Deps{Provider: p, Metrics: m, Registry: reg, Log: slog.New(slog.DiscardHandler)}, m
}

func call(ctx context.Context, p llm.Provider) error {
	_, err := p.Stream(ctx, protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "hi"}}},
		func(protocol.Chunk) error { return nil })
	return err
}

func TestNewNeedsDeps(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{}, Deps{}); err == nil {
		t.Fatal("New without metrics, registry and logger: want an error")
	}
	d, _ := newDeps(t, &scripted{})
	if _, err := New(Config{Shared: &upstream.RedisConfig{Prefix: "x:"}}, d); err == nil {
		t.Fatal("New with shared state and no Redis client: want an error")
	}
}

// One provider: its calls are counted under its name beneath one breaker,
// which opens after BREAKER_FAILURES and then refuses without calling it,
// with an error llm.IsCircuitOpen recognises; the stack's OpenFor tells the
// gate. The workers' view asks to wait for capacity, the direct one not.
func TestSingleProviderBehindItsBreaker(t *testing.T) {
	t.Parallel()
	p := &scripted{}
	d, m := newDeps(t, p)
	s, err := New(Config{Breaker: breaker.Config{ConsecutiveFailures: 2, OpenTimeout: time.Minute}}, d)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	if err := call(ctx, s.Provider()); err != nil || p.waited.Load() {
		t.Fatalf("direct call: %v, waited %v; want ok and no capacity wait", err, p.waited.Load())
	}
	if err := call(ctx, s.ForWorkers()); err != nil || !p.waited.Load() {
		t.Fatalf("worker call: %v, waited %v; want ok and a capacity wait", err, p.waited.Load())
	}
	p.err.Store(&llm.Error{Retryable: true, Status: http.StatusBadGateway, Err: errors.New("502")})
	for range 2 {
		if err := call(ctx, s.Provider()); llm.IsCircuitOpen(err) || err == nil {
			t.Fatalf("call while failing: %v, want the provider's 502", err)
		}
	}
	before := p.calls.Load()
	if err := call(ctx, s.Provider()); !llm.IsCircuitOpen(err) {
		t.Fatalf("call after 2 failures: %v, want the open circuit's refusal", err)
	}
	if p.calls.Load() != before {
		t.Fatal("the provider was called behind an open circuit")
	}
	if left := s.OpenFor(); left <= 0 || left > time.Minute {
		t.Fatalf("OpenFor = %v, want up to a minute", left)
	}
	if got := promtest.ToFloat64(m.UpstreamResponses.WithLabelValues("scripted", "502")); got != 2 {
		t.Fatalf("502 responses counted %v, want 2", got)
	}
	if got := promtest.ToFloat64(m.CircuitState.WithLabelValues("scripted")); got != 2 {
		t.Fatalf("spillway_circuit_state = %v, want 2 (open)", got)
	}
}

// With adaptive concurrency the pool's limit learns from the provider's
// calls: a 429 halves it, through SetPoolLimit, once Run reports.
func TestSingleProviderAdaptiveLimit(t *testing.T) {
	t.Parallel()
	p := &scripted{}
	d, _ := newDeps(t, p)
	limits := make(chan int, 16)
	d.SetPoolLimit = func(n int) { limits <- n }
	s, err := New(Config{Adaptive: &adaptive.Config{Params: adaptive.Params{Floor: 1, Ceiling: 8, Interval: time.Hour}}}, d)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	go func() { s.Run(ctx); close(ran) }()
	p.err.Store(&llm.Error{Retryable: true, Status: http.StatusTooManyRequests, Err: errors.New("429")})
	_ = call(t.Context(), s.Provider())
	deadline := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case n := <-limits:
			done = n == 4
		case <-deadline:
			t.Fatal("the pool's limit did not halve to 4 after a 429")
		}
	}
	cancel()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// Several upstreams, each a real OpenAI-compatible server: each sits
// behind its own breaker, named after it, so a failing one opens only its
// circuit and is routed around while the stack as a whole stays open for
// calls (OpenFor 0).
func TestSeveralUpstreamsBreakerEach(t *testing.T) {
	t.Parallel()
	sim, err := llm.NewSim(llm.SimConfig{Tokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	good := httptest.NewServer(simserver.New(sim, slog.New(slog.DiscardHandler)))
	defer good.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"down"}}`, http.StatusInternalServerError)
	}))
	defer bad.Close()
	d, m := newDeps(t, nil)
	s, err := New(Config{
		OpenAI:    llm.OpenAIConfig{Model: "m"},
		Upstreams: []upstream.Spec{{Name: "good", BaseURL: good.URL + "/v1", Weight: 1}, {Name: "bad", BaseURL: bad.URL + "/v1", Weight: 1}},
		Balancer:  upstream.Config{Routing: upstream.RoutingWeighted},
		Health:    upstream.HealthConfig{MaxFails: 1000},
		Breaker:   breaker.Config{ConsecutiveFailures: 1, OpenTimeout: time.Minute},
	}, d)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 40 {
		if err := call(t.Context(), s.Provider()); err != nil {
			t.Fatalf("call %d: %v; want every call served by good", i, err)
		}
	}
	if got := promtest.ToFloat64(m.CircuitState.WithLabelValues("bad")); got != 2 {
		t.Fatalf("bad's circuit %v, want 2 (open)", got)
	}
	if got := promtest.ToFloat64(m.CircuitState.WithLabelValues("good")); got != 0 {
		t.Fatalf("good's circuit %v, want 0 (closed)", got)
	}
	if left := s.OpenFor(); left != 0 {
		t.Fatalf("OpenFor = %v with one circuit of two open, want 0", left)
	}
	if got := promtest.ToFloat64(m.UpstreamResponses.WithLabelValues("bad", "500")); got != 1 {
		t.Fatalf("bad's 500s counted %v, want 1 (then its circuit refused)", got)
	}
}
