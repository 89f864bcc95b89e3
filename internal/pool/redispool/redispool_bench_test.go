package redispool

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// BenchmarkTryAcquireRelease measures one TryAcquire plus its Release
// against a real redis-server, one at a time and with 16 goroutines per
// CPU sharing one Pool (each its own user), without idle leases (two
// script calls a pair) and with them (idle.go: none in the common case,
// one when every pair is another user's: "distinct"),
// and reports ops/s, the p50/p99 latency of the pair and the Redis
// commands the Pool's client sent per pair (calls/op).
func BenchmarkTryAcquireRelease(b *testing.B) {
	s := redistest.Start(b)
	for _, mode := range []struct {
		name string
		hold time.Duration
	}{{"release", 0}, {"idle", DefaultIdleHold}} {
		cfg := Config{Size: 1 << 20, PerUser: 1 << 20, LeaseTTL: 30 * time.Second, IdleHold: mode.hold}

		b.Run(mode.name+"/serial", func(b *testing.B) {
			cfg := cfg
			cfg.Prefix = redistest.Prefix(b)
			p, cc := newCountedPool(b, s.Addr, cfg)
			ctx := context.Background()
			if mode.hold > 0 {
				warmIdle(b, p, "u", 1)
			}
			lat := make([]time.Duration, 0, 1<<16)
			calls := cc.calls.Load()
			for b.Loop() {
				start := time.Now()
				l, err := p.TryAcquire(ctx, "u")
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
				lat = append(lat, time.Since(start))
			}
			reportLatency(b, lat)
			b.ReportMetric(float64(cc.calls.Load()-calls)/float64(len(lat)), "calls/op")
		})

		// Every pair by another user: with idle leases the acquire gives
		// the previous user's idle lease back in its own call (swap).
		b.Run(mode.name+"/distinct", func(b *testing.B) {
			cfg := cfg
			cfg.Prefix = redistest.Prefix(b)
			p, cc := newCountedPool(b, s.Addr, cfg)
			ctx := context.Background()
			if mode.hold > 0 {
				warmIdle(b, p, "u", 1)
			}
			users := make([]string, 1024)
			for i := range users {
				users[i] = newID()
			}
			lat := make([]time.Duration, 0, 1<<16)
			calls := cc.calls.Load()
			for b.Loop() {
				start := time.Now()
				l, err := p.TryAcquire(ctx, users[len(lat)%len(users)])
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
				lat = append(lat, time.Since(start))
			}
			reportLatency(b, lat)
			b.ReportMetric(float64(cc.calls.Load()-calls)/float64(len(lat)), "calls/op")
		})

		b.Run(mode.name+"/parallel", func(b *testing.B) {
			cfg := cfg
			cfg.Prefix = redistest.Prefix(b)
			p, cc := newCountedPool(b, s.Addr, cfg)
			ctx := context.Background()
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(16)
			calls := cc.calls.Load()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				user := newID()
				mine := make([]time.Duration, 0, 1<<12)
				for pb.Next() {
					start := time.Now()
					l, err := p.TryAcquire(ctx, user)
					if err != nil {
						b.Error(err)
						return
					}
					l.Release()
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			reportLatency(b, lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(cc.calls.Load()-calls)/float64(len(lat)), "calls/op")
			}
		})
	}
}

func reportLatency(b *testing.B, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "ops/s")
}
