package kafka

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/kafkatest"
)

// The benchmarks run against kfake in the same process: they measure this
// package and kafka-go on loopback, not a real broker's disk.

// BenchmarkEnqueue is one Enqueue (acks all) at a time: the api's latency
// per queued request, dominated by BatchTimeout.
func BenchmarkEnqueue(b *testing.B) {
	cluster := kafkatest.Start(b)
	q := newQueue(b, testConfig(b, cluster.Brokers, 4, nil))
	body := make([]byte, 512)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := q.Enqueue(ctx, fmt.Sprintf("req-%d", i), body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnqueueParallel is many api requests enqueueing at once; they
// share producer batches.
func BenchmarkEnqueueParallel(b *testing.B) {
	cluster := kafkatest.Start(b)
	q := newQueue(b, testConfig(b, cluster.Brokers, 4, nil))
	body := make([]byte, 512)
	var n atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := q.Enqueue(context.Background(), fmt.Sprintf("req-%d", n.Add(1)), body); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRoundTrip is one job at a time through enqueue → fetch → ack
// (with claims and the offset commit): the queue's share of a queued
// request's latency when workers are idle.
func BenchmarkRoundTrip(b *testing.B) {
	cluster := kafkatest.Start(b)
	q := newQueue(b, testConfig(b, cluster.Brokers, 4, newMemClaims()))
	c := newConsumer(b, q, "bench")
	body := make([]byte, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Join the group before timing.
	if err := q.Enqueue(ctx, "warm-up", body); err != nil {
		b.Fatal(err)
	}
	for _, d := range fetchAll(b, c, 1) {
		if err := c.Ack(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := q.Enqueue(ctx, fmt.Sprintf("req-%d", i), body); err != nil {
			b.Fatal(err)
		}
		ds, err := c.Fetch(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Ack(ctx, ds[0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkThroughput enqueues b.N jobs from 16 goroutines while one
// member fetches up to 16 at a time and acknowledges each: ns/op is the
// queue's cost per job under load.
func BenchmarkThroughput(b *testing.B) {
	cluster := kafkatest.Start(b)
	q := newQueue(b, testConfig(b, cluster.Brokers, 4, newMemClaims()))
	c := newConsumer(b, q, "bench")
	body := make([]byte, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := q.Enqueue(ctx, "warm-up", body); err != nil {
		b.Fatal(err)
	}
	for _, d := range fetchAll(b, c, 1) {
		if err := c.Ack(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var next atomic.Int64
	producers := make(chan error, 16)
	for range 16 {
		go func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					producers <- nil
					return
				}
				if err := q.Enqueue(ctx, fmt.Sprintf("req-%d", i), body); err != nil {
					producers <- err
					return
				}
			}
		}()
	}
	for done := 0; done < b.N; {
		ds, err := c.Fetch(ctx, 16)
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range ds {
			if err := c.Ack(ctx, d); err != nil {
				b.Fatal(err)
			}
		}
		done += len(ds)
	}
	for range 16 {
		if err := <-producers; err != nil {
			b.Fatal(err)
		}
	}
}
