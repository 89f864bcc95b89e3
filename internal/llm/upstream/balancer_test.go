package upstream

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// fakeClock is an injected clock for LocalHealth.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func specsFor(mocks []*mockUpstream, cap int) []Spec {
	specs := make([]Spec, len(mocks))
	for i, m := range mocks {
		specs[i] = Spec{Name: "u" + string(rune('0'+i)), BaseURL: m.url(), Weight: 1, MaxConcurrency: cap}
	}
	return specs
}

func TestFailureBeforeFirstChunkGoesToAnotherUpstream(t *testing.T) {
	t.Parallel()
	bad, good := newMock(t), newMock(t)
	bad.status.Store(503)
	specs := specsFor([]*mockUpstream{bad, good}, 0)
	m := newCountingMetrics()
	b, err := New(specs, Config{Routing: RoutingWeighted}, Deps{NewProvider: openAIProvider, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Smooth weighted round-robin with equal weights picks upstream 0 first.
	got, err := collect(context.Background(), b, chat("hi"))
	if err != nil || got != "hello" {
		t.Fatalf("Stream = %q, %v; want hello and no error", got, err)
	}
	if bad.calls.Load() != 1 || good.calls.Load() != 1 {
		t.Fatalf("calls bad %d good %d, want 1 and 1", bad.calls.Load(), good.calls.Load())
	}
	if m.get("u0/error") != 1 || m.get("u1/ok") != 1 {
		t.Fatalf("metrics %v", m.requests)
	}
	// Both failing: the caller gets the retryable error, each tried once.
	good.status.Store(502)
	_, err = collect(context.Background(), b, chat("hi"))
	if !llm.IsRetryable(err) || bad.calls.Load() != 2 || good.calls.Load() != 2 {
		t.Fatalf("err %v, calls %d/%d; want a retryable error after one call each", err, bad.calls.Load(), good.calls.Load())
	}
}

func TestEjectAfterMaxFailsAndReturnAfterTrial(t *testing.T) {
	t.Parallel()
	mocks := []*mockUpstream{newMock(t), newMock(t), newMock(t)}
	mocks[1].status.Store(503)
	const capacity = 2
	specs := specsFor(mocks, capacity)
	clock := newFakeClock()
	var logs logBuffer
	m := newCountingMetrics()
	b, err := New(specs, Config{}, Deps{
		NewProvider: openAIProvider,
		Health:      NewLocalHealth(len(specs), HealthConfig{MaxFails: 3, Cooldown: time.Minute}, clock.now),
		Metrics:     m, Log: testLogger(&logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	// 8 workers × 15 calls through the waiting path: all served, caps held.
	var wg sync.WaitGroup
	var failures atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				r, err := b.Acquire(context.Background(), chat("hi"))
				if err != nil {
					failures.Add(1)
					continue
				}
				var sb strings.Builder
				if _, err := r.Stream(context.Background(), chat("hi"), func(chunk protocol.Chunk) error {
					s := chunk.Content
					sb.WriteString(s)
					return nil
				}); err != nil || sb.String() != "hello" {
					failures.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failures.Load() != 0 {
		t.Fatalf("%d of 120 calls failed; want every one served", failures.Load())
	}
	for i, mk := range mocks {
		if p := mk.peak.Load(); p > capacity {
			t.Errorf("upstream %d peaked at %d calls, cap %d", i, p, capacity)
		}
	}
	if c := mocks[1].calls.Load(); c < 3 || c > 3+capacity-1 {
		t.Fatalf("failing upstream got %d calls; want ejection after 3 (plus at most %d already admitted)", c, capacity-1)
	}
	if got := b.health.State(1); got != Ejected {
		t.Fatalf("state %v, want ejected", got)
	}
	if h, ok := m.isHealthy("u1"); !ok || h {
		t.Fatalf("healthy gauge of u1: %v (set %v), want 0", h, ok)
	}
	if !strings.Contains(logs.String(), "upstream: ejected") || !strings.Contains(logs.String(), "upstream=u1") {
		t.Fatalf("no ejection log line: %s", logs.String())
	}

	// It recovers; after the cooldown the next call is its trial.
	mocks[1].status.Store(200)
	before := mocks[1].calls.Load()
	clock.advance(time.Minute + time.Millisecond)
	if got := b.health.State(1); got != Trial {
		t.Fatalf("state after cooldown %v, want trial", got)
	}
	if _, err := collect(context.Background(), b, chat("hi")); err != nil {
		t.Fatal(err)
	}
	if mocks[1].calls.Load() != before+1 || b.health.State(1) != Healthy {
		t.Fatalf("trial call: calls %d→%d, state %v; want one call and healthy", before, mocks[1].calls.Load(), b.health.State(1))
	}
	if !strings.Contains(logs.String(), "upstream: returned") {
		t.Fatalf("no return log line: %s", logs.String())
	}
	// Full share again at once: least-loaded with idle upstreams spreads
	// 300 sequential calls at random, about a third each.
	before = mocks[1].calls.Load()
	for range 300 {
		if _, err := collect(context.Background(), b, chat("hi")); err != nil {
			t.Fatal(err)
		}
	}
	if n := mocks[1].calls.Load() - before; n < 60 {
		t.Fatalf("returned upstream got %d of 300 calls, want about 100", n)
	}
}

func TestTrialFailureSitsOutAgain(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	h := NewLocalHealth(1, HealthConfig{MaxFails: 2, Cooldown: time.Second}, clock.now)
	ctx := context.Background()
	for i := range 2 {
		ej, _ := h.Failed(ctx, 0, Failure{Reason: "503"})
		if ej != (i == 1) {
			t.Fatalf("failure %d: ejected %v", i+1, ej)
		}
	}
	if ok := h.ClaimTrial(ctx, 0); ok {
		t.Fatal("trial claimed while ejected")
	}
	clock.advance(time.Second)
	if !h.ClaimTrial(ctx, 0) || h.ClaimTrial(ctx, 0) {
		t.Fatal("want exactly one trial claim")
	}
	if ej, _ := h.Failed(ctx, 0, Failure{Trial: true}); !ej || h.State(0) != Ejected {
		t.Fatal("a failed trial must sit out another cooldown at once")
	}
	if back, _ := h.Succeeded(ctx, 0); back || h.State(0) != Ejected {
		t.Fatal("a success while sitting out (an older call) must not end the ejection")
	}
}

func TestRetryAfterSitsUpstreamOut(t *testing.T) {
	t.Parallel()
	throttled, other := newMock(t), newMock(t)
	throttled.status.Store(429)
	throttled.retryAfter.Store("120")
	specs := specsFor([]*mockUpstream{throttled, other}, 0)
	m := newCountingMetrics()
	clock := newFakeClock()
	b, err := New(specs, Config{Routing: RoutingWeighted, RetryAfterMax: 5 * time.Second}, Deps{
		NewProvider: openAIProvider, Metrics: m,
		Health: NewLocalHealth(2, HealthConfig{Cooldown: time.Minute}, clock.now),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 20 {
		if got, err := collect(context.Background(), b, chat("x")); err != nil || got != "hello" {
			t.Fatalf("Stream = %q, %v", got, err)
		}
	}
	if throttled.calls.Load() != 1 || other.calls.Load() != 20 || m.get("u0/throttled") != 1 {
		t.Fatalf("calls %d/%d, throttled metric %d; want one 429 then the other carries all", throttled.calls.Load(), other.calls.Load(), m.get("u0/throttled"))
	}
	// Retry-After 120s capped at 5s: back for its trial after 5s, not 60s.
	clock.advance(5 * time.Second)
	if st := b.health.State(0); st != Trial {
		t.Fatalf("after the capped Retry-After: %v, want trial", st)
	}
}

func TestModelsRouting(t *testing.T) {
	t.Parallel()
	a, bm, anyM := newMock(t), newMock(t), newMock(t)
	specs := []Spec{
		{Name: "a", BaseURL: a.url(), Weight: 1, Models: []string{"m-a"}},
		{Name: "b", BaseURL: bm.url(), Weight: 1, Models: []string{"m-b", "m-a"}},
		{Name: "any", BaseURL: anyM.url(), Weight: 1},
	}
	b, err := New(specs, Config{}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 30 {
		req := chat("x")
		req.Model = "m-c"
		if _, err := collect(context.Background(), b, req); err != nil {
			t.Fatal(err)
		}
	}
	if a.calls.Load() != 0 || bm.calls.Load() != 0 || anyM.calls.Load() != 30 {
		t.Fatalf("m-c went to a %d, b %d, any %d; want only any", a.calls.Load(), bm.calls.Load(), anyM.calls.Load())
	}
	for range 60 {
		req := chat("x")
		req.Model = "m-b"
		if _, err := collect(context.Background(), b, req); err != nil {
			t.Fatal(err)
		}
	}
	if a.calls.Load() != 0 || bm.calls.Load() == 0 {
		t.Fatalf("m-b reached a (%d) or never b (%d)", a.calls.Load(), bm.calls.Load())
	}
	if b.Models() != nil {
		t.Fatalf("Models = %v, want nil when one upstream serves any", b.Models())
	}

	only, err := New(specs[:2], Config{}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	if got := only.Models(); len(got) != 2 || got[0] != "m-a" || got[1] != "m-b" {
		t.Fatalf("Models = %v, want [m-a m-b]", got)
	}
	req := chat("x")
	req.Model = "m-z"
	if _, err := only.TryAcquire(context.Background(), req); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown model: %v, want ErrUnknownModel", err)
	}
}

func TestNoUpstreamThenWaitForSlot(t *testing.T) {
	t.Parallel()
	mk := newMock(t)
	specs := specsFor([]*mockUpstream{mk}, 1)
	b, err := New(specs, Config{}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	held, err := b.TryAcquire(ctx, chat("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, chat("x")); !errors.Is(err, ErrNoUpstream) {
		t.Fatalf("TryAcquire at the cap: %v, want ErrNoUpstream", err)
	}
	if _, err := b.Stream(ctx, chat("x"), func(protocol.Chunk) error { return nil }); !errors.Is(err, ErrNoUpstream) || mk.calls.Load() != 0 {
		t.Fatalf("Stream at the cap: %v after %d calls, want ErrNoUpstream before any call", err, mk.calls.Load())
	}
	got := make(chan error, 1)
	go func() {
		r, err := b.Acquire(ctx, chat("x"))
		if err == nil {
			_, err = r.Stream(ctx, chat("x"), func(protocol.Chunk) error { return nil })
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Acquire returned %v while the only slot is held", err)
	default:
	}
	held.Release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting Acquire not woken by the release")
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	held, _ = b.TryAcquire(ctx, chat("x"))
	defer held.Release()
	if _, err := b.Acquire(wctx, chat("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: %v", err)
	}
}

func TestQuotaTreatsUpstreamAsFull(t *testing.T) {
	t.Parallel()
	limited, spare := newMock(t), newMock(t)
	specs := []Spec{
		{Name: "limited", BaseURL: limited.url(), Weight: 100, RPM: 3},
		{Name: "spare", BaseURL: spare.url(), Weight: 1},
	}
	b, err := New(specs, Config{Routing: RoutingWeighted}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 10 {
		if _, err := collect(context.Background(), b, chat("x")); err != nil {
			t.Fatal(err)
		}
	}
	if limited.calls.Load() != 3 || spare.calls.Load() != 7 {
		t.Fatalf("calls limited %d spare %d; want 3 within rpm 3, the rest on the spare", limited.calls.Load(), spare.calls.Load())
	}
	// Tokens: tpm 100 and a request reserving more than what is left.
	q := NewLocalQuota([]Spec{{TPM: 100}})
	if ok, _, _ := q.Reserve(context.Background(), 0, EstimateTokens(200, 40)); !ok {
		t.Fatal("first reservation of 90 tokens refused")
	}
	if ok, wait, _ := q.Reserve(context.Background(), 0, 20); ok || wait <= 0 {
		t.Fatalf("reservation beyond tpm: ok %v wait %v", ok, wait)
	}
}

func TestProbeBringsBackAndCountsFailures(t *testing.T) {
	t.Parallel()
	mk := newMock(t)
	specs := specsFor([]*mockUpstream{mk}, 0)
	clock := newFakeClock()
	h := NewLocalHealth(1, HealthConfig{MaxFails: 2, Cooldown: time.Second}, clock.now)
	b, err := New(specs, Config{}, Deps{NewProvider: openAIProvider, Health: h})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	mk.status.Store(500)
	b.ProbeAll(ctx)
	b.ProbeAll(ctx)
	if h.State(0) != Ejected || mk.probes.Load() != 2 {
		t.Fatalf("after two failed probes: %v, %d probes", h.State(0), mk.probes.Load())
	}
	b.ProbeAll(ctx) // sitting out: not probed
	if mk.probes.Load() != 2 {
		t.Fatal("probed while sitting out")
	}
	mk.status.Store(200)
	clock.advance(time.Second)
	b.ProbeAll(ctx)
	if h.State(0) != Healthy || mk.probes.Load() != 3 || mk.calls.Load() != 0 {
		t.Fatalf("probe trial: state %v, %d probes, %d calls", h.State(0), mk.probes.Load(), mk.calls.Load())
	}
}

func TestLatencyRouterPrefersFasterUpstream(t *testing.T) {
	t.Parallel()
	slow, fast := newMock(t), newMock(t)
	slow.delay.Store(int64(500 * time.Millisecond)) // far above any noise in fast's latency
	specs := specsFor([]*mockUpstream{slow, fast}, 0)
	b, err := New(specs, Config{Routing: RoutingLatency}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 30 {
		if _, err := collect(context.Background(), b, chat("x")); err != nil {
			t.Fatal(err)
		}
	}
	// Each is measured once, then the slow one never wins a draw.
	if s, f := slow.calls.Load(), fast.calls.Load(); s > 2 || f < 28 {
		t.Fatalf("slow %d fast %d; want the fast one to take nearly all", s, f)
	}
}

func TestAffinityThroughBalancer(t *testing.T) {
	t.Parallel()
	mocks := []*mockUpstream{newMock(t), newMock(t), newMock(t)}
	specs := specsFor(mocks, 0)
	b, err := New(specs, Config{Routing: RoutingAffinity}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := llm.WithCaller(context.Background(), llm.Caller{Session: "conversation-42"})
	for range 20 {
		if _, err := collect(ctx, b, chat("x")); err != nil {
			t.Fatal(err)
		}
	}
	hit := 0
	for _, mk := range mocks {
		if n := mk.calls.Load(); n == 20 {
			hit++
		} else if n != 0 {
			t.Fatalf("session split: %d calls on one upstream", n)
		}
	}
	if hit != 1 {
		t.Fatal("session not kept on one upstream")
	}
}
