package pubsub

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// BenchmarkRoundTrip measures PUBLISH from one client until the payload is
// read from the Subscription, against a real redis-server.
func BenchmarkRoundTrip(b *testing.B) {
	srv := redistest.Start(b)
	pub := srv.Client(b)
	s := newSubscriber(b, Config{}, srv.Client(b))
	sub := mustSubscribe(b, s, redistest.Prefix(b)+"rt")
	defer sub.Close()
	ctx := context.Background()
	payload := `BATCH:[{"seq":1,"content":"Hello"}]`
	b.ReportAllocs()
	for b.Loop() {
		if err := pub.Publish(ctx, sub.Channel(), payload).Err(); err != nil {
			b.Fatal(err)
		}
		if _, ok := <-sub.C(); !ok {
			b.Fatalf("subscription ended: %v", sub.Err())
		}
	}
}

// BenchmarkRoundTripParallel is BenchmarkRoundTrip with one subscription
// per goroutine, all multiplexed over the default shards.
func BenchmarkRoundTripParallel(b *testing.B) {
	srv := redistest.Start(b)
	pub := srv.Client(b)
	s := newSubscriber(b, Config{}, srv.Client(b))
	prefix := redistest.Prefix(b)
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		sub := mustSubscribe(b, s, fmt.Sprintf("%s%d", prefix, n.Add(1)))
		defer sub.Close()
		ctx := context.Background()
		for pb.Next() {
			if err := pub.Publish(ctx, sub.Channel(), "chunk").Err(); err != nil {
				b.Error(err)
				return
			}
			if _, ok := <-sub.C(); !ok {
				b.Errorf("subscription ended: %v", sub.Err())
				return
			}
		}
	})
}

// BenchmarkSubscribeClose measures a confirmed Subscribe followed by Close,
// the per-request cost on the queued path.
func BenchmarkSubscribeClose(b *testing.B) {
	srv := redistest.Start(b)
	s := newSubscriber(b, Config{}, srv.Client(b))
	prefix := redistest.Prefix(b)
	ctx := context.Background()
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		sub, err := s.Subscribe(ctx, fmt.Sprintf("%s%d", prefix, i))
		if err != nil {
			b.Fatal(err)
		}
		sub.Close()
	}
}

// BenchmarkSubscribeCloseParallel shows how concurrent Subscribes share
// batched SUBSCRIBE commands.
func BenchmarkSubscribeCloseParallel(b *testing.B) {
	srv := redistest.Start(b)
	s := newSubscriber(b, Config{}, srv.Client(b))
	prefix := redistest.Prefix(b)
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			sub, err := s.Subscribe(ctx, fmt.Sprintf("%s%d", prefix, n.Add(1)))
			if err != nil {
				b.Error(err)
				return
			}
			sub.Close()
		}
	})
}
