package admission

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/redistest"
	"github.com/spillway-dev/spillway/internal/testutil"
)

func TestWaitQuantile(t *testing.T) {
	t.Parallel()
	hist := func(pairs ...int64) (h [len(waitBounds) + 1]int64) {
		for i := 0; i+1 < len(pairs); i += 2 {
			h[pairs[i]] = pairs[i+1]
		}
		return h
	}
	tests := []struct {
		name   string
		counts [len(waitBounds) + 1]int64
		lo, hi time.Duration
	}{
		{"none", hist(), 0, 0},
		{"all under 500ms", hist(0, 100), 490 * time.Millisecond, 500 * time.Millisecond},
		// 98 fast, 2 in (15s, 20s]: the 99th is among the slow ones.
		{"two slow of a hundred", hist(0, 98, 6, 2), 15 * time.Second, 20 * time.Second},
		// One slow of a thousand is beyond the 99th percentile.
		{"one slow of a thousand", hist(1, 999, 7, 1), 500 * time.Millisecond, time.Second},
		{"beyond every bound", hist(int64(len(waitBounds)), 5), 5 * time.Minute, 5 * time.Minute},
	}
	for _, tt := range tests {
		if got := waitQuantile(tt.counts, 0.99); got < tt.lo || got > tt.hi {
			t.Errorf("%s: p99 %s, want within [%s, %s]", tt.name, got, tt.lo, tt.hi)
		}
	}
}

// Two processes report to one Redis; each reads the sum of both, which
// is what makes the error rate and queue wait cluster-wide.
func TestRecentIsClusterWide(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	prefix := redistest.Prefix(t)
	a, err := NewRecent(prefix, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewRecent(prefix, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	// a: 30 calls, 3 failed; waits all short. b: 10 calls, 7 failed; two
	// waits of 20 s among 18 short ones.
	for i := range 30 {
		a.ObserveCall(i < 3)
		a.ObserveWait(100 * time.Millisecond)
	}
	for i := range 10 {
		b.ObserveCall(i < 7)
	}
	for i := range 20 {
		w := 200 * time.Millisecond
		if i < 2 {
			w = 20 * time.Second
		}
		b.ObserveWait(w)
	}
	now := time.Now()
	a.Refresh(t.Context(), now)
	b.Refresh(t.Context(), now)
	a.Refresh(t.Context(), now) // reads b's flush too
	for name, r := range map[string]*Recent{"a": a, "b": b} {
		if got := r.ErrorRate(); got != 0.25 {
			t.Errorf("%s: error rate %v, want 10/40", name, got)
		}
		// 2 of 50 waits took 20 s: the p99 is in (15 s, 20 s].
		if got := r.QueueWaitP99(); got <= 15*time.Second || got > 20*time.Second {
			t.Errorf("%s: queue wait p99 %s, want in (15s, 20s]", name, got)
		}
	}
	// Counts flushed once are not added again.
	a.Refresh(t.Context(), now)
	if got := a.view.Load().calls; got != 40 {
		t.Errorf("calls after a second refresh: %d, want 40", got)
	}
}

// Buckets older than a minute (Redis time) drop out of the sum.
func TestRecentForgetsAfterAMinute(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	start := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	mr.SetTime(start)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	r, err := NewRecent("q:", rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		r.ObserveCall(true)
	}
	r.Refresh(t.Context(), start)
	mr.SetTime(start.Add(30 * time.Second))
	for range 10 {
		r.ObserveCall(false)
	}
	r.Refresh(t.Context(), start.Add(30*time.Second))
	if got := r.ErrorRate(); got != 0.5 {
		t.Fatalf("error rate at 30 s: %v, want 0.5", got)
	}
	mr.SetTime(start.Add(65 * time.Second))
	r.Refresh(t.Context(), start.Add(65*time.Second))
	if got := r.ErrorRate(); got != 0 {
		t.Fatalf("error rate at 65 s, the failures a minute old: %v, want 0", got)
	}
	if got := r.view.Load().calls; got != 10 {
		t.Fatalf("calls at 65 s: %d, want the 10 of the last minute", got)
	}
	// The stale fields are gone from the hash.
	if keys, _ := mr.HKeys(RecentKey("q:")); len(keys) != 1 {
		t.Errorf("fields left: %v, want one (the calls of 30 s)", keys)
	}
}

// A flush that fails keeps its counts for the next one; a read that keeps
// failing drops the cached figures after a minute.
func TestRecentSurvivesRedisAway(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	r, err := NewRecent("q:", rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r.ObserveCall(true)
	r.Refresh(t.Context(), now)
	if r.ErrorRate() != 1 {
		t.Fatalf("error rate %v, want 1", r.ErrorRate())
	}
	mr.Close()
	r.ObserveCall(false)
	r.Refresh(t.Context(), now.Add(time.Second))
	if r.ErrorRate() != 1 {
		t.Errorf("error rate while Redis is away: %v, want the last read (1)", r.ErrorRate())
	}
	r.Refresh(t.Context(), now.Add(2*time.Minute))
	if r.ErrorRate() != 0 {
		t.Errorf("error rate after a minute without a read: %v, want 0", r.ErrorRate())
	}
	if err := mr.Restart(); err != nil {
		t.Fatal(err)
	}
	r.Refresh(t.Context(), now.Add(3*time.Minute))
	if got := r.view.Load().calls; got != 2 {
		t.Errorf("calls after Redis came back: %d, want 2 (the pending one flushed)", got)
	}
}
