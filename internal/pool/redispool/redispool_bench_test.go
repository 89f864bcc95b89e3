package redispool

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/redistest"
)

// BenchmarkTryAcquireRelease measures one TryAcquire plus its Release (two
// script calls) against a real redis-server, one at a time and with 16
// goroutines per CPU sharing one Pool, and reports ops/s and the p50/p99
// latency of the pair.
func BenchmarkTryAcquireRelease(b *testing.B) {
	s := redistest.Start(b)
	cfg := Config{Size: 1 << 20, PerUser: 1 << 20, LeaseTTL: 30 * time.Second}

	b.Run("serial", func(b *testing.B) {
		cfg := cfg
		cfg.Prefix = redistest.Prefix(b)
		p := newTestPool(b, s.Addr, cfg, nil, nil)
		ctx := context.Background()
		lat := make([]time.Duration, 0, 1<<16)
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
	})

	b.Run("parallel", func(b *testing.B) {
		cfg := cfg
		cfg.Prefix = redistest.Prefix(b)
		p := newTestPool(b, s.Addr, cfg, nil, nil)
		ctx := context.Background()
		var mu sync.Mutex
		var lat []time.Duration
		b.SetParallelism(16)
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
	})
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
