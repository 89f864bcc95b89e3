package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// BenchmarkWorkerRelay measures the queued path's throughput without the
// api: jobs go through memqueue to a worker, whose batches travel through
// the Redis result channel (results.Publisher on miniredis over TCP) to a
// subscriber per job. Each iteration
// answers `parallel` jobs of `tokens` chunks from an instant simulator.
func BenchmarkWorkerRelay(b *testing.B) {
	const (
		tokens   = 64
		parallel = 4
	)
	for _, batch := range []int{1, 5, 20} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			mr := miniredis.RunT(b)
			rdb := redis.NewClient(&redis.Options{
				Addr:                     mr.Addr(),
				PoolSize:                 4 * parallel,
				MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
			})
			b.Cleanup(func() { _ = rdb.Close() })
			e := newEnv(b, 15*time.Second, 4*parallel)
			pub, err := results.NewPublisher(benchPrefix, rdb)
			if err != nil {
				b.Fatal(err)
			}
			sim, err := llm.NewSim(llm.SimConfig{Tokens: tokens, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			cfg := workerConfig()
			cfg.Concurrency = parallel
			cfg.BatchSize = batch
			cfg.Heartbeat = 5 * time.Second
			w, err := worker.New(cfg, worker.Deps{
				Consumer: e.q.Consumer("bench"), Pool: e.pool, Provider: sim, Results: pub, Cancels: pub,
				Metrics: e.m, Log: testutil.DiscardLogger(),
			})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan struct{})
			go func() { defer close(stopped); _ = w.Run(ctx) }()
			b.Cleanup(func() { cancel(); <-stopped })

			var chunks, messages int
			var mu sync.Mutex
			n := 0
			for b.Loop() {
				var wg sync.WaitGroup
				for range parallel {
					n++
					id := fmt.Sprintf("bench-%d", n)
					wg.Go(func() {
						c, m := relayOne(b, e, rdb, id)
						mu.Lock()
						chunks += c
						messages += m
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			secs := b.Elapsed().Seconds()
			b.ReportMetric(float64(chunks)/secs, "chunks/s")
			b.ReportMetric(float64(messages)/secs, "msgs/s")
		})
	}
}

// relayOne subscribes to a job's result channel, enqueues the job and
// reads until DONE; it returns the chunks and messages received.
func relayOne(b *testing.B, e *env, rdb *redis.Client, id string) (chunks, messages int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ps := rdb.Subscribe(ctx, failover.ResultChannel(benchPrefix, id))
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		b.Errorf("SUBSCRIBE: %v", err)
		return 0, 0
	}
	body, err := protocol.EncodeJob(newJob(id))
	if err == nil {
		err = e.q.Enqueue(ctx, id, body)
	}
	if err != nil {
		b.Errorf("enqueue: %v", err)
		return 0, 0
	}
	for {
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			b.Errorf("receive %s after %d chunks: %v", id, chunks, err)
			return chunks, messages
		}
		messages++
		res, err := protocol.DecodeResult([]byte(msg.Payload))
		if err != nil {
			b.Errorf("malformed %q: %v", msg.Payload, err)
			return chunks, messages
		}
		switch res.Kind {
		case protocol.KindBatch:
			chunks += len(res.Chunks)
		case protocol.KindError:
			b.Errorf("job %s: %+v", id, res.Problem)
			return chunks, messages
		case protocol.KindDone:
			if chunks != tokensOf(res) {
				b.Errorf("job %s: %d chunks, DONE counts %d", id, chunks, tokensOf(res))
			}
			return chunks, messages
		}
	}
}

// benchPrefix is QUEUE_PREFIX's default.
const benchPrefix = "queue:"

func tokensOf(res protocol.Result) int {
	if res.Done == nil || res.Done.Usage == nil {
		return -1
	}
	return res.Done.Usage.CompletionTokens
}
