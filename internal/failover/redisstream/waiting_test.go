package redisstream

import (
	"fmt"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/redistest"
)

// Waiting counts jobs no worker has taken: backlog minus pending.
func TestWaitingExcludesPending(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	q := newQueue(t, client, redistest.Prefix(t), "w1")
	ctx := ctxT(t, 10*time.Second)
	if n, err := q.Waiting(ctx); err != nil || n != 0 {
		t.Fatalf("empty queue without a group: %d, %v", n, err)
	}
	for i := range 5 {
		if err := q.Enqueue(ctx, fmt.Sprint("r", i), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.Waiting(ctx); err != nil || n != 5 {
		t.Fatalf("before any fetch: %d, %v; want 5", n, err)
	}
	ds, err := q.Fetch(ctx, 2)
	if err != nil || len(ds) != 2 {
		t.Fatalf("fetch: %d, %v", len(ds), err)
	}
	if n, err := q.Waiting(ctx); err != nil || n != 3 {
		t.Fatalf("two taken: %d, %v; want 3", n, err)
	}
	if err := q.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	depth, _ := q.Depth(ctx)
	if n, err := q.Waiting(ctx); err != nil || n != 3 || depth != 4 {
		t.Fatalf("after one ack: waiting %d depth %d, %v; want 3 and 4", n, depth, err)
	}
}
