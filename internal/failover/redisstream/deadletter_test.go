package redisstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// deadLetterN enqueues n jobs (request ids req-0…) on q and dead-letters
// each through q's own consumer, the way a worker does.
func deadLetterN(tb testing.TB, q *Queue, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range n {
		if err := q.Enqueue(ctx, fmt.Sprintf("req-%d", i), fmt.Appendf(nil, "job-%d", i)); err != nil {
			tb.Fatalf("Enqueue %d: %v", i, err)
		}
	}
	for done := 0; done < n; {
		ds, err := q.Fetch(ctx, n)
		if err != nil {
			tb.Fatalf("Fetch: %v", err)
		}
		for _, d := range ds {
			if err := q.DeadLetter(ctx, d, "provider kept failing"); err != nil {
				tb.Fatalf("DeadLetter %s: %v", d.ID, err)
			}
			done++
		}
	}
}

// TestDeadLetterPages: on one stream and on several shards, pages of any
// size return every record exactly once and oldest first; a record is
// found by its id, deleted by it, and a purge empties every shard.
func TestDeadLetterPages(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			q := newShardedQueue(t, client, redistest.Prefix(t), "c", shards)
			const n = 13
			deadLetterN(t, q, n)
			all, err := q.DeadLetters(ctx, 100)
			if err != nil || len(all) != n {
				t.Fatalf("DeadLetters = %d, %v; want %d", len(all), err, n)
			}
			want := make([]string, n)
			for i, d := range all {
				want[i] = d.ID
				if i > 0 && d.FailedAt.Before(all[i-1].FailedAt) {
					t.Fatalf("not oldest first at %d: %v after %v", i, d.FailedAt, all[i-1].FailedAt)
				}
			}
			for _, size := range []int{1, 2, 5, n, 50} {
				var got []string
				cursor := ""
				for pages := 0; ; pages++ {
					if pages > n+1 {
						t.Fatalf("size %d: no end after %d pages", size, pages)
					}
					page, next, err := q.DeadLetterPage(ctx, cursor, size)
					if err != nil {
						t.Fatalf("size %d after %q: %v", size, cursor, err)
					}
					if len(page) > size {
						t.Fatalf("size %d: page of %d", size, len(page))
					}
					for _, d := range page {
						got = append(got, d.ID)
					}
					if next == "" {
						break
					}
					cursor = next
				}
				if !slices.Equal(got, want) {
					t.Fatalf("size %d: ids %v, want %v", size, got, want)
				}
			}

			one, err := q.DeadLetterByID(ctx, all[3].ID)
			if err != nil || one.ID != all[3].ID || string(one.Body) != string(all[3].Body) || one.RequestID != all[3].RequestID {
				t.Fatalf("DeadLetterByID(%s) = %+v, %v; want %+v", all[3].ID, one, err, all[3])
			}
			for _, id := range []string{"1-1", "99:1-1", "garbage", "", "0:x-1"} {
				if _, err := q.DeadLetterByID(ctx, id); !errors.Is(err, failover.ErrDeadLetterNotFound) {
					t.Errorf("DeadLetterByID(%q) = %v, want ErrDeadLetterNotFound", id, err)
				}
			}
			if _, _, err := q.DeadLetterPage(ctx, "a,b,c,d,e,f,g", 3); err == nil {
				t.Error("DeadLetterPage accepted a malformed cursor")
			}

			if _, err := q.DeleteDeadLetters(ctx, all[3].ID, "garbage"); !errors.Is(err, failover.ErrDeadLetterNotFound) {
				t.Fatalf("DeleteDeadLetters with a malformed id = %v, want ErrDeadLetterNotFound", err)
			}
			if d, err := q.DeleteDeadLetters(ctx, all[3].ID, all[5].ID); err != nil || d != 2 {
				t.Fatalf("DeleteDeadLetters = %d, %v; want 2", d, err)
			}
			if d, err := q.DeleteDeadLetters(ctx, all[3].ID); err != nil || d != 0 {
				t.Fatalf("DeleteDeadLetters again = %d, %v; want 0", d, err)
			}
			if _, err := q.DeadLetterByID(ctx, all[3].ID); !errors.Is(err, failover.ErrDeadLetterNotFound) {
				t.Fatalf("deleted record still found: %v", err)
			}
			if depth, err := q.DeadLetterDepth(ctx); err != nil || depth != n-2 {
				t.Fatalf("DeadLetterDepth = %d, %v; want %d", depth, err, n-2)
			}
			purged, err := q.PurgeDeadLetters(ctx)
			if err != nil || purged != n-2 {
				t.Fatalf("PurgeDeadLetters = %d, %v; want %d", purged, err, n-2)
			}
			if depth, err := q.DeadLetterDepth(ctx); err != nil || depth != 0 {
				t.Fatalf("DeadLetterDepth after purge = %d, %v", depth, err)
			}
			// The queue itself is untouched and dead-letters again.
			deadLetterN(t, q, 1)
			if depth, err := q.DeadLetterDepth(ctx); err != nil || depth != 1 {
				t.Fatalf("DeadLetterDepth after a new dead letter = %d, %v; want 1", depth, err)
			}
		})
	}
}
