package admission

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// quotaBackends runs f against real Redis and against miniredis, which
// embedded mode uses.
func quotaBackends(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient, prefix string)) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		f(t, srv.Client(t), redistest.Prefix(t))
	})
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		f(t, rdb, "q:")
	})
}

func TestQuotaPerIdentity(t *testing.T) {
	t.Parallel()
	quotaBackends(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		q, err := NewQuota(QuotaConfig{Prefix: prefix, MaxPerIdentity: 2, MaxBytes: 1 << 20, RetryAfter: 2500 * time.Millisecond}, rdb)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, id := range []string{"r1", "r2"} {
			if p, err := q.Reserve(ctx, "user:alice", id, 10, time.Minute); p != nil || err != nil {
				t.Fatalf("reserve %s: %v %v", id, p, err)
			}
		}
		p, err := q.Reserve(ctx, "user:alice", "r3", 10, time.Minute)
		if err != nil || p == nil || p.Status != http.StatusTooManyRequests || p.Slug() != protocol.ProblemTooManyQueued || p.RetryAfterSeconds != 3 { // 2.5 s rounded up
			t.Fatalf("third: %+v %v, want 429 too-many-queued advising 3s", p, err)
		}
		if p, err := q.Reserve(ctx, "user:bob", "r4", 10, time.Minute); p != nil || err != nil {
			t.Fatalf("bob refused: %v %v", p, err)
		}
		// Releasing twice frees one place only.
		for range 2 {
			if err := q.Release(ctx, "user:alice", "r1"); err != nil {
				t.Fatal(err)
			}
		}
		if p, err := q.Reserve(ctx, "user:alice", "r5", 10, time.Minute); p != nil || err != nil {
			t.Fatalf("after release: %v %v", p, err)
		}
		if p, _ := q.Reserve(ctx, "user:alice", "r6", 10, time.Minute); p == nil {
			t.Fatal("a double release freed two places")
		}
	})
}

func TestQuotaBytes(t *testing.T) {
	t.Parallel()
	quotaBackends(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		q, err := NewQuota(QuotaConfig{Prefix: prefix, MaxPerIdentity: 100, MaxBytes: 100}, rdb)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if p, err := q.Reserve(ctx, "a", "r1", 60, time.Minute); p != nil || err != nil {
			t.Fatalf("first: %v %v", p, err)
		}
		p, err := q.Reserve(ctx, "b", "r2", 41, time.Minute)
		if err != nil || p == nil || p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemQueueOverflow {
			t.Fatalf("over the bytes: %+v %v, want 503 queue-overflow", p, err)
		}
		if p, err := q.Reserve(ctx, "b", "r3", 40, time.Minute); p != nil || err != nil {
			t.Fatalf("exactly at the bound: %v %v", p, err)
		}
		if err := q.Release(ctx, "a", "r1"); err != nil {
			t.Fatal(err)
		}
		if p, err := q.Reserve(ctx, "b", "r2", 41, time.Minute); p != nil || err != nil {
			t.Fatalf("after release: %v %v", p, err)
		}
	})
}

// ReleaseMany uncounts jobs of several identities in one call, each
// once however often it is named, places and bytes alike.
func TestQuotaReleaseMany(t *testing.T) {
	t.Parallel()
	quotaBackends(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		q, err := NewQuota(QuotaConfig{Prefix: prefix, MaxPerIdentity: 2, MaxBytes: 100}, rdb)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, e := range []struct{ who, id string }{{"a", "r1"}, {"a", "r2"}, {"b", "r3"}} {
			if p, err := q.Reserve(ctx, e.who, e.id, 30, time.Minute); p != nil || err != nil {
				t.Fatalf("reserve %s: %v %v", e.id, p, err)
			}
		}
		if err := q.ReleaseMany(ctx, []string{"a", "b", "a"}, []string{"r1", "r3", "r1"}); err != nil {
			t.Fatal(err)
		}
		if err := q.ReleaseMany(ctx, nil, nil); err != nil {
			t.Fatal(err)
		}
		if err := q.ReleaseMany(ctx, []string{"a"}, nil); err == nil {
			t.Fatal("slices of different lengths accepted")
		}
		// a holds one place (r2), so one more fits and then none; 30 bytes
		// are counted, so 70 more fit and then none.
		if p, err := q.Reserve(ctx, "a", "r4", 40, time.Minute); p != nil || err != nil {
			t.Fatalf("a after release: %v %v", p, err)
		}
		if p, _ := q.Reserve(ctx, "a", "r5", 1, time.Minute); p == nil || p.Status != http.StatusTooManyRequests {
			t.Fatalf("a's third place: %+v, want too-many-queued (a double release freed two)", p)
		}
		if p, err := q.Reserve(ctx, "b", "r6", 30, time.Minute); p != nil || err != nil {
			t.Fatalf("b at the byte bound: %v %v", p, err)
		}
		if p, _ := q.Reserve(ctx, "b", "r7", 1, time.Minute); p == nil || p.Status != http.StatusServiceUnavailable {
			t.Fatalf("over the bytes: %+v, want queue-overflow", p)
		}
	})
}

// An entry never released (its api died) stops counting at its deadline,
// for the identity and for the bytes.
func TestQuotaEntriesExpire(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	q, err := NewQuota(QuotaConfig{Prefix: redistest.Prefix(t), MaxPerIdentity: 1, MaxBytes: 10}, rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if p, err := q.Reserve(ctx, "a", "dead", 10, 200*time.Millisecond); p != nil || err != nil {
		t.Fatalf("%v %v", p, err)
	}
	if p, _ := q.Reserve(ctx, "a", "r2", 1, time.Minute); p == nil {
		t.Fatal("second job counted while the first waits")
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		p, err := q.Reserve(ctx, "a", "r2", 10, time.Minute)
		return p == nil && err == nil
	}, "the unreleased entry expired")
}

// No key of the quota lives for ever: each expires once every entry it
// holds has, its TTL only ever lengthened by a later job's wait.
func TestQuotaKeysExpire(t *testing.T) {
	t.Parallel()
	quotaBackends(t, func(t *testing.T, rdb redis.UniversalClient, prefix string) {
		q, err := NewQuota(QuotaConfig{Prefix: prefix, MaxPerIdentity: 10, MaxBytes: 1 << 20}, rdb)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if p, err := q.Reserve(ctx, "a", "long", 10, time.Hour); p != nil || err != nil {
			t.Fatalf("%v %v", p, err)
		}
		if p, err := q.Reserve(ctx, "b", "short", 10, time.Minute); p != nil || err != nil {
			t.Fatalf("%v %v", p, err)
		}
		for _, key := range q.keys("a") {
			ttl, err := rdb.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 59*time.Minute || ttl > time.Hour {
				t.Errorf("key %s has TTL %v, want the longest wait (1h), not cut by the later shorter one", key, ttl)
			}
		}
	})
}

// A Redis failure is an error, not a refusal: the caller answers
// queue-unavailable.
func TestQuotaRedisFailure(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	q, err := NewQuota(QuotaConfig{Prefix: "q:"}, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := q.Reserve(context.Background(), "a", "r", 1, time.Second); p != nil || err == nil {
		t.Fatalf("%v %v, want an error", p, err)
	}
	if _, err := NewQuota(QuotaConfig{}, rdb); err == nil {
		t.Fatal("a quota without a prefix was built")
	}
}
