package redisstream

import (
	"errors"
	"fmt"
	"testing"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// Progress counts jobs handed to the group and jobs waiting, over every
// shard, against a real redis-server; acknowledging (which deletes the
// entry) keeps the counters exact.
func TestProgress(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprint(shards, " shards"), func(t *testing.T) {
			q := newShardedQueue(t, srv.Client(t), redistest.Prefix(t), "c1", shards)
			ctx := t.Context()
			if _, _, err := q.Progress(ctx); !errors.Is(err, ErrNoProgress) {
				t.Fatalf("before the group exists: %v, want ErrNoProgress", err)
			}
			if err := q.Enqueue(ctx, "r0", []byte("{}")); err != nil {
				t.Fatal(err)
			}
			ds, err := q.Fetch(ctx, 1) // creates the groups
			if err != nil || len(ds) != 1 {
				t.Fatalf("fetch: %v %v", ds, err)
			}
			for i := 1; i <= 6; i++ {
				if err := q.Enqueue(ctx, fmt.Sprint("r", i), []byte("{}")); err != nil {
					t.Fatal(err)
				}
			}
			handed, waiting, err := q.Progress(ctx)
			if err != nil || handed != 1 || waiting != 6 {
				t.Fatalf("after 7 enqueued, 1 fetched: handed %d waiting %d err %v, want 1 and 6", handed, waiting, err)
			}
			if err := q.Ack(ctx, ds[0]); err != nil {
				t.Fatal(err)
			}
			got := 0
			for got < 4 {
				ds, err := q.Fetch(ctx, 4-got)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range ds {
					if err := q.Ack(ctx, d); err != nil {
						t.Fatal(err)
					}
				}
				got += len(ds)
			}
			handed, waiting, err = q.Progress(ctx)
			if err != nil || handed != 5 || waiting != 2 {
				t.Fatalf("after 5 fetched and acked: handed %d waiting %d err %v, want 5 and 2", handed, waiting, err)
			}
		})
	}
}
