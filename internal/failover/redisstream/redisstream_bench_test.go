package redisstream

import (
	"context"
	"testing"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

var benchBody = []byte(`{"request_id":"3f6c1b2e-bench","user_id":"u1","messages":[{"role":"user","content":"Hello there, how are you today?"}],"model":"sim-1","max_tokens":256}`)

// BenchmarkEnqueue measures XADD of one job, one caller at a time and from
// many goroutines.
func BenchmarkEnqueue(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		q := newQueue(b, c, redistest.Prefix(b), "bench")
		b.SetBytes(int64(len(benchBody)))
		b.ReportAllocs()
		for b.Loop() {
			if err := q.Enqueue(ctx, "r", benchBody); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		q := newQueue(b, c, redistest.Prefix(b), "bench")
		b.SetBytes(int64(len(benchBody)))
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := q.Enqueue(ctx, "r", benchBody); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkEnqueueFetchAck measures one job's whole trip through the
// queue: Enqueue, Fetch, Ack (XADD, XREADGROUP, MULTI XACK+XDEL).
func BenchmarkEnqueueFetchAck(b *testing.B) {
	srv := redistest.Start(b)
	q := newQueue(b, srv.Client(b), redistest.Prefix(b), "bench")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := q.Enqueue(ctx, "r", benchBody); err != nil {
			b.Fatal(err)
		}
		ds, err := q.Fetch(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := q.Ack(ctx, ds[0]); err != nil {
			b.Fatal(err)
		}
	}
	if n, err := q.Depth(ctx); err != nil || n != 0 {
		b.Fatalf("Depth after benchmark = %d, %v; want 0", n, err)
	}
}
