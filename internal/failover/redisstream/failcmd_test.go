package redisstream

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestEveryRedisCommandFailing fails each Redis command of each path of
// the queue in turn (an error reply, or a pipeline refused as a whole as
// after a rotated password), with one shard and with several: no path
// panics, and each returns an error, but Fetch's handing out of jobs it
// had already taken, which drops a held job whose claim it cannot check
// (it is taken over again later).
func TestEveryRedisCommandFailing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, shards := range []int{1, 3} {
		client, hook := srv.FailClient(t)
		prefix := redistest.Prefix(t)
		if shards > 1 {
			prefix += "sharded:"
		}
		q := newShardedQueue(t, client, prefix, "w1", shards)
		other := newShardedQueue(t, srv.Client(t), prefix, "w0", shards)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		var d failover.Delivery
		enqueue := func(tb testing.TB) {
			tb.Helper()
			if err := other.Enqueue(ctx, "r", []byte("{}")); err != nil {
				tb.Fatal(err)
			}
		}
		// taken gives w1 a job to settle.
		taken := func(tb testing.TB) {
			tb.Helper()
			enqueue(tb)
			ds, err := q.Fetch(ctx, 1)
			if err != nil || len(ds) != 1 {
				tb.Fatalf("fetch: %d, %v", len(ds), err)
			}
			d = ds[0]
		}
		// orphaned leaves a job of w0 idle past fast's reclaim time.
		fast, err := New(Config{Prefix: prefix, Consumer: "w1", ReclaimIdle: time.Millisecond, Shards: shards}, client)
		if err != nil {
			t.Fatal(err)
		}
		orphaned := func(tb testing.TB) {
			tb.Helper()
			enqueue(tb)
			if ds, err := other.Fetch(ctx, 1); err != nil || len(ds) != 1 {
				tb.Fatalf("fetch: %d, %v", len(ds), err)
			}
		}
		redistest.FailEachCommand(t, hook,
			redistest.FailPath{Name: "Enqueue", Run: func() error { return q.Enqueue(ctx, "r", []byte("{}")) }},
			redistest.FailPath{Name: "Fetch", Setup: enqueue, Run: func() error {
				_, err := q.Fetch(ctx, 5)
				return err
			}},
			redistest.FailPath{Name: "Ack", Setup: taken, Run: func() error { return q.Ack(ctx, d) }},
			redistest.FailPath{Name: "Touch", Setup: taken, Run: func() error { return q.Touch(ctx, d) }},
			redistest.FailPath{Name: "DeadLetter", Setup: taken, Run: func() error { return q.DeadLetter(ctx, d, "why") }},
			redistest.FailPath{Name: "Reclaim", Setup: orphaned, Run: func() error {
				_, err := fast.Reclaim(ctx, 5)
				return err
			}},
			redistest.FailPath{Name: "Waiting", Run: func() error {
				_, err := q.Waiting(ctx)
				return err
			}},
			redistest.FailPath{Name: "Depth", Run: func() error {
				_, err := q.Depth(ctx)
				return err
			}},
			redistest.FailPath{Name: "Progress", Run: func() error {
				_, _, err := q.Progress(ctx)
				return err
			}},
			redistest.FailPath{Name: "DeadLetterDepth", Run: func() error {
				_, err := q.DeadLetterDepth(ctx)
				return err
			}},
			redistest.FailPath{Name: "DeadLetterPage", Run: func() error {
				_, _, err := q.DeadLetterPage(ctx, "", 10)
				return err
			}},
			redistest.FailPath{Name: "PurgeDeadLetters", Run: func() error {
				_, err := q.PurgeDeadLetters(ctx)
				return err
			}},
		)
	}
}
