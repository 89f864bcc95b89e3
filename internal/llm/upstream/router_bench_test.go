package upstream

import (
	"context"
	"fmt"
	"testing"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// BenchmarkPick measures one routing decision over 8 upstreams.
func BenchmarkPick(b *testing.B) {
	for _, routing := range []string{RoutingLeastLoaded, RoutingWeighted, RoutingAffinity, RoutingLatency} {
		b.Run(routing, func(b *testing.B) {
			ups := fakeUps(1, 2, 3, 1, 2, 3, 1, 2)
			for i, u := range ups {
				u.local.Store(int64(i % 3))
			}
			r, err := NewRouter(routing, len(ups), 0)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if r.Pick(ups, Choice{Eligible: all(8), Key: "session-123"}) < 0 {
						b.Fatal("no pick")
					}
				}
			})
		})
	}
}

type nopProvider struct{}

func (nopProvider) Name() string { return "nop" }
func (nopProvider) Stream(context.Context, protocol.ChatRequest, func(protocol.Chunk) error) (llm.Result, error) {
	return llm.Result{}, nil
}

// BenchmarkReserve measures the whole in-process reservation (eligibility,
// pick, cap, release) over 8 capped upstreams, the direct path's cost.
func BenchmarkReserve(b *testing.B) {
	specs := make([]Spec, 8)
	for i := range specs {
		specs[i] = Spec{Name: fmt.Sprintf("u%d", i), BaseURL: "http://x/v1", Weight: 1, MaxConcurrency: 1 << 20}
	}
	bal, err := New(specs, Config{}, Deps{NewProvider: func(Spec) (llm.Provider, error) { return nopProvider{}, nil }})
	if err != nil {
		b.Fatal(err)
	}
	defer bal.Close()
	req := chat("hello")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := bal.TryAcquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		r.Release()
	}
}
