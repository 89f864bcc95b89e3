package admission

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/breaker"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// benchChecks builds the request-path checks in their accepting state:
// the overflow gate, and the Gate over the provider's circuit and the
// identity limit.
func benchChecks(b *testing.B) (*Overflow, *Gate) {
	b.Helper()
	log := testutil.DiscardLogger()
	m := newMetrics(b)
	fd := &fakeDepth{}
	fd.set(42, nil)
	o, err := NewOverflow(OverflowConfig{Threshold: 10000, Hysteresis: 500, RefreshEvery: time.Second, RetryAfterMax: time.Minute}, DepthFunc(fd.read), m, log)
	if err != nil {
		b.Fatal(err)
	}
	o.refresh(context.Background(), time.Now())
	br, err := breaker.New(breaker.Config{}, okProvider{}, m, log)
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: the limiter is off
	b.Cleanup(func() { _ = rdb.Close() })
	rl, err := NewRateLimiter(RateLimitConfig{}, rdb, m, log)
	if err != nil {
		b.Fatal(err)
	}
	svc, err := NewServiceTime(time.Second, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	g, err := NewGate(GateDeps{Limiter: rl, Circuit: br, Metrics: m, Service: svc, Pool: capacity(8)})
	if err != nil {
		b.Fatal(err)
	}
	return o, g
}

// okProvider answers every call at once.
type okProvider struct{}

func (okProvider) Name() string { return "ok" }
func (okProvider) Stream(context.Context, protocol.ChatRequest, func(protocol.Chunk) error) (llm.Result, error) {
	return llm.Result{}, nil
}

// admit is the accept path the api runs per request: identity limit, open
// circuit, queue overflow.
func admit(ctx context.Context, o *Overflow, g *Gate, identity string) *protocol.Problem {
	if p := g.Admit(ctx, identity, protocol.PriorityHigh); p != nil {
		return p
	}
	return o.Check(protocol.PriorityHigh)
}

func BenchmarkAdmitAccept(b *testing.B) {
	o, g := benchChecks(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if p := admit(ctx, o, g, "user-1"); p != nil {
			b.Fatal(p)
		}
	}
}

func BenchmarkAdmitAcceptParallel(b *testing.B) {
	o, g := benchChecks(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if p := admit(ctx, o, g, "user-1"); p != nil {
				b.Fatal(p)
			}
		}
	})
}

// BenchmarkOverflowRefuse is the refusal path: a counter increment and a
// problem copy.
func BenchmarkOverflowRefuse(b *testing.B) {
	o, _ := benchChecks(b)
	fd := &fakeDepth{}
	fd.set(20000, nil)
	o.backlog = DepthFunc(fd.read)
	o.refresh(context.Background(), time.Now())
	b.ReportAllocs()
	for b.Loop() {
		if o.Check(protocol.PriorityHigh) == nil {
			b.Fatal("accepted")
		}
	}
}

// BenchmarkLocalGCRA is the per-request cost of the Redis-down fallback.
func BenchmarkLocalGCRA(b *testing.B) {
	g := newLocalGCRA(limitFor(1e6, 1000), 10000)
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		g.allow("user-1", now)
	}
}

// BenchmarkRateLimiterRedis is the per-request cost with the limiter on: one
// GCRA script call on a local redis-server.
func BenchmarkRateLimiterRedis(b *testing.B) {
	s := redistest.Start(b)
	rl, err := NewRateLimiter(RateLimitConfig{RPS: 1e6, Burst: 1e6, KeyPrefix: redistest.Prefix(b)}, s.Client(b), newMetrics(b), testutil.DiscardLogger())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if p := rl.Allow(ctx, "user-1"); p != nil {
			b.Fatal(p)
		}
	}
	if rl.Degraded() {
		b.Fatal("limiter fell back to local: the figure is not Redis's")
	}
}
