package redisstream

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
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

// TestCountsAfterPasswordRotation: once Redis's requirepass changes, every
// new connection is refused (WRONGPASS) and go-redis fails a pipeline
// without an error on its commands. Waiting, Depth, Progress and
// DeadLetterDepth, which read pipelines, return an error instead of
// reading a nil reply (the api crashed in a loop here), and count again
// once the password matches.
func TestCountsAfterPasswordRotation(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := ctxT(t, 20*time.Second)
	admin := srv.Client(t) // authenticated before the change, so it stays so
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "old", MaxRetries: -1})
	t.Cleanup(func() { _ = client.Close() })
	if err := admin.ConfigSet(ctx, "requirepass", "old").Err(); err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, client, redistest.Prefix(t), "w1")
	if err := q.Enqueue(ctx, "r1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	counts := map[string]func() error{
		"Waiting":         func() error { _, err := q.Waiting(ctx); return err },
		"Depth":           func() error { _, err := q.Depth(ctx); return err },
		"Progress":        func() error { _, _, err := q.Progress(ctx); return err },
		"DeadLetterDepth": func() error { _, err := q.DeadLetterDepth(ctx); return err },
	}
	if n, err := q.Waiting(ctx); err != nil || n != 1 {
		t.Fatalf("before the rotation: waiting %d, %v; want 1", n, err)
	}
	if err := admin.ConfigSet(ctx, "requirepass", "new").Err(); err != nil {
		t.Fatal(err)
	}
	// Every connection of the queue's client must dial again.
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	for name, f := range counts {
		if err := f(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("%s with a rotated password: %v, want a WRONGPASS error", name, err)
		}
	}
	if err := admin.ConfigSet(ctx, "requirepass", "old").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Waiting(ctx); err != nil || n != 1 {
		t.Fatalf("once the password matches again: waiting %d, %v; want 1", n, err)
	}
}
