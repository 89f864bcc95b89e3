package admission

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// benchChecks builds the request-path checks in their accepting state.
func benchChecks(b *testing.B) (*Overflow, *Breaker, *RateLimiter) {
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
	br, err := NewBreaker(BreakerConfig{}, &fakeProvider{fn: func(context.Context, func(protocol.Chunk) error) (llm.Result, error) {
		return llm.Result{}, nil
	}}, m, log)
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: the limiter is off
	b.Cleanup(func() { _ = rdb.Close() })
	rl, err := NewRateLimiter(RateLimitConfig{}, rdb, m, log)
	if err != nil {
		b.Fatal(err)
	}
	return o, br, rl
}

// admit is the accept path the api runs per request: identity limit, open
// circuit, queue overflow.
func admit(ctx context.Context, o *Overflow, br *Breaker, rl *RateLimiter, identity string) *protocol.Problem {
	if p := rl.Allow(ctx, identity); p != nil {
		return p
	}
	if p := br.Check(protocol.PriorityHigh); p != nil {
		return p
	}
	return o.Check(protocol.PriorityHigh)
}

func BenchmarkAdmitAccept(b *testing.B) {
	o, br, rl := benchChecks(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if p := admit(ctx, o, br, rl, "user-1"); p != nil {
			b.Fatal(p)
		}
	}
}

func BenchmarkAdmitAcceptParallel(b *testing.B) {
	o, br, rl := benchChecks(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if p := admit(ctx, o, br, rl, "user-1"); p != nil {
				b.Fatal(p)
			}
		}
	})
}

// BenchmarkOverflowRefuse is the refusal path: a counter increment and a
// problem copy.
func BenchmarkOverflowRefuse(b *testing.B) {
	o, _, _ := benchChecks(b)
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
