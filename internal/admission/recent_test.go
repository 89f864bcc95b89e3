package admission

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
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
	a, err := NewRecent(RecentConfig{Prefix: prefix}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewRecent(RecentConfig{Prefix: prefix}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	// a: 30 requests, 3 failed; waits all short. b: 10 requests, 7 failed; two
	// waits of 20 s among 18 short ones.
	for i := range 30 {
		a.ObserveRequest(failedIf(i < 3))
		a.ObserveWait(100 * time.Millisecond)
	}
	for i := range 10 {
		b.ObserveRequest(failedIf(i < 7))
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
	if got := a.view.Load().ended; got != 40 {
		t.Errorf("requests after a second refresh: %d, want 40", got)
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
	r, err := NewRecent(RecentConfig{Prefix: "q:"}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		r.ObserveRequest(errProvider)
	}
	r.Refresh(t.Context(), start)
	mr.SetTime(start.Add(30 * time.Second))
	for range 10 {
		r.ObserveRequest(nil)
	}
	r.Refresh(t.Context(), start.Add(30*time.Second))
	if got := r.ErrorRate(); got != 0.5 {
		t.Fatalf("error rate at 30 s: %v, want 0.5", got)
	}
	if got := r.LatestErrorRate(); got != 0 {
		t.Fatalf("latest error rate at 30 s: %v, want 0 (the failures are 30 s old)", got)
	}
	mr.SetTime(start.Add(65 * time.Second))
	r.Refresh(t.Context(), start.Add(65*time.Second))
	if got := r.ErrorRate(); got != 0 {
		t.Fatalf("error rate at 65 s, the failures a minute old: %v, want 0", got)
	}
	if got := r.view.Load().ended; got != 10 {
		t.Fatalf("requests at 65 s: %d, want the 10 of the last minute", got)
	}
	// The stale fields are gone from the hash.
	if keys, _ := mr.HKeys(RecentKey("q:")); len(keys) != 1 {
		t.Errorf("fields left: %v, want one (the requests of 30 s)", keys)
	}
}

// A flush that fails keeps its counts for the next one; a read that keeps
// failing drops the cached figures after a minute.
func TestRecentSurvivesRedisAway(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	r, err := NewRecent(RecentConfig{Prefix: "q:"}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r.ObserveRequest(errProvider)
	r.Refresh(t.Context(), now)
	if r.ErrorRate() != 1 {
		t.Fatalf("error rate %v, want 1", r.ErrorRate())
	}
	mr.Close()
	r.ObserveRequest(nil)
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
	if got := r.view.Load().ended; got != 2 {
		t.Errorf("requests after Redis came back: %d, want 2 (the pending one flushed)", got)
	}
}

// errProvider is a failure the provider owns: a 502 after every retry.
var errProvider = &llm.Error{Status: 502, Retryable: true, Err: errors.New("bad gateway")}

// failedIf is errProvider when failed, else nil (a complete answer).
func failedIf(failed bool) error {
	if failed {
		return errProvider
	}
	return nil
}

// A request counts once, as its client saw it: failed only for a reason
// the provider owns; 429s, cancels and refusals of its own content count
// neither way.
func TestRequestOutcome(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		err           error
		counts, faild bool
	}{
		{"answered", nil, true, false},
		{"5xx after every retry", errProvider, true, true},
		{"503", &llm.Error{Status: 503, Retryable: true}, true, true},
		{"stalled", fmt.Errorf("read: %w", llm.ErrIdleTimeout), true, true},
		{"refused connection", &llm.Error{Retryable: true, Err: errors.New("connection refused")}, true, true},
		{"401", &llm.Error{Status: 401}, true, true},
		{"circuit stayed open", &llm.Error{Retryable: true, RetryAfter: time.Second, Err: fmt.Errorf("breaker: provider p: %w", llm.ErrCircuitOpen)}, true, true},
		{"429 after every retry", &llm.Error{Status: 429, Retryable: true, RetryAfter: time.Second}, false, false},
		{"the request's own 400", &llm.Error{Status: 400}, false, false},
		{"the request's own 422", &llm.Error{Status: 422}, false, false},
		{"cancelled", fmt.Errorf("call: %w", context.Canceled), false, false},
		{"no upstream capacity", llm.ErrNoCapacity, false, false},
		{"the answer could not be handed on", errors.New("publish: redis down"), false, false},
	}
	for _, tt := range tests {
		counts, failed := RequestOutcome(tt.err)
		if counts != tt.counts || failed != tt.faild {
			t.Errorf("%s: counts %v failed %v, want %v %v", tt.name, counts, failed, tt.counts, tt.faild)
		}
	}
}

// A shorter window (as tests use) keeps buckets of a sixth of it: a
// failure leaves the sum once the window passed, on Redis time.
func TestRecentWindowScales(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	start := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	mr.SetTime(start)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	r, err := NewRecent(RecentConfig{Prefix: "q:", Window: 6 * time.Second}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	r.ObserveRequest(errProvider)
	r.Refresh(t.Context(), start)
	mr.SetTime(start.Add(3 * time.Second))
	r.ObserveRequest(nil)
	r.Refresh(t.Context(), start.Add(3*time.Second))
	if got, n := r.ErrorRate(), r.Requests(); got != 0.5 || n != 2 {
		t.Fatalf("at 3 s: error rate %v of %d, want 0.5 of 2", got, n)
	}
	mr.SetTime(start.Add(7 * time.Second))
	r.Refresh(t.Context(), start.Add(7*time.Second))
	if got, n := r.ErrorRate(), r.Requests(); got != 0 || n != 1 {
		t.Fatalf("at 7 s: error rate %v of %d, want 0 of the 1 request of the last 6 s", got, n)
	}
	if _, err := NewRecent(RecentConfig{Window: time.Millisecond}, rdb, nil); err == nil {
		t.Error("a window shorter than its buckets was accepted")
	}
}
