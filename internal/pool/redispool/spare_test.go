package redispool

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Spare leases (spare.go) against a real redis-server: a burst after a
// quiet spell makes one Redis call for as many streams as the user held
// here at once before, limits stay exact, and the pool's last slots are
// never asked for.

// holdAndFlush makes user hold n direct leases of p at once, gives them
// back, and waits until the idle ones went back to Redis (a quiet spell
// longer than IdleHold, without waiting for it).
//
// It also lets spares be asked for however slow a block call was: on a
// loaded machine a call can take over defaultSpareMaxCall, which would
// switch spares off and leave these tests nothing to see (that rule has
// its own test, TestNoSparesAfterASlowBlock).
func holdAndFlush(tb testing.TB, p *Pool, rdb redis.UniversalClient, prefix, user string, n int) {
	tb.Helper()
	holdAndFlushBy(tb, p, p.TryAcquire, rdb, prefix, user, n)
}

// holdAndFlushBy is holdAndFlush with the leases taken by acquire
// (warmIdleBy).
func holdAndFlushBy(tb testing.TB, p *Pool, acquire acquireFunc, rdb redis.UniversalClient, prefix, user string, n int) {
	tb.Helper()
	p.spareMaxCall.Store(int64(time.Hour))
	warmIdleBy(tb, p, acquire, user, n)
	p.requestFlush("")
	testutil.Eventually(tb, 5*time.Second, func() bool {
		all, _ := liveLeases(tb, rdb, prefix, "")
		return p.idleLen() == 0 && all == 0
	}, "idle leases given back")
}

// A burst of an api's direct requests, or of a consumer's jobs (a job's
// first try for a slot is a direct request to the pool).
func TestBurstAfterQuietSpellTakesSpareLeases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		acquire func(*Pool) acquireFunc
	}{
		{"direct requests", func(p *Pool) acquireFunc { return p.TryAcquire }},
		{"jobs", func(p *Pool) acquireFunc { return p.Acquire }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			admin := s.Client(t)
			const burst = 50
			cfg := Config{Prefix: redistest.Prefix(t), Size: 100_000, PerUser: 100_000, IdleHold: 10 * time.Second}
			p, cc := newCountedPool(t, s.Addr, cfg)
			acquire := tc.acquire(p)
			holdAndFlushBy(t, p, acquire, admin, cfg.Prefix, "u", burst)

			ctx := context.Background()
			before := cc.blocks.Load()
			ls := make([]pool.Lease, 0, burst)
			for range burst {
				l, err := acquire(ctx, "u")
				if err != nil {
					t.Fatal(err)
				}
				ls = append(ls, l)
			}
			if n := cc.blocks.Load() - before; n != 1 {
				t.Fatalf("a burst of %d streams after a quiet spell made %d block.lua calls, want 1 (the first stream's, with %d spares)", burst, n, burst-1)
			}
			// Spares are real leases: the pool and the user count each once.
			if all, mine := liveLeases(t, admin, cfg.Prefix, "u"); all != burst || mine != burst {
				t.Fatalf("leases in Redis: pool %d, user %d; want %d, %d", all, mine, burst, burst)
			}
			for _, l := range ls {
				l.Release()
			}
			p.requestFlush("")
			testutil.Eventually(t, 5*time.Second, func() bool {
				all, _ := liveLeases(t, admin, cfg.Prefix, "")
				return all == 0
			}, "every lease given back")
		})
	}
}

// A burst whose first block is still out: the requests that arrive
// meanwhile take its spares when its reply comes, instead of waiting for
// a second block.
func TestSparesGoToRequestsWaitingForTheBlock(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	px := startProxy(t, s.Addr)
	const burst = 20
	cfg := Config{Prefix: redistest.Prefix(t), Size: 100_000, PerUser: 100_000, IdleHold: 10 * time.Second}
	c := redis.NewClient(&redis.Options{Addr: px.Listen})
	cc := &callCounter{}
	c.AddHook(cc)
	p, err := New(cfg, c, testutil.DiscardLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(p.Close)
	holdAndFlush(t, p, admin, cfg.Prefix, "u", burst)
	addLatency(t, px, "slow", 150, 0) // below callTimeout: slow, not suspect

	ctx := context.Background()
	before := cc.blocks.Load()
	leases := make(chan pool.Lease, burst)
	var wg sync.WaitGroup
	acquire := func() {
		l, err := p.TryAcquire(ctx, "u")
		if err != nil {
			t.Error(err)
			return
		}
		leases <- l
	}
	wg.Go(acquire)
	testutil.Eventually(t, 5*time.Second, func() bool { return cc.blocks.Load() > before }, "the first block sent")
	for range burst - 1 {
		wg.Go(acquire)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.blockReqs) == burst-1 || len(leases) > 0
	}, "the rest of the burst waiting for a block")
	wg.Wait()
	close(leases)
	if n := cc.blocks.Load() - before; n != 1 {
		t.Fatalf("%d block.lua calls for a burst of %d, want 1: the requests that came while it was out took its spares", n, burst)
	}
	n := 0
	for l := range leases {
		n++
		l.Release()
	}
	if n != burst {
		t.Fatalf("%d of %d requests granted", n, burst)
	}
}

// Spares never take the pool's last slots, nor a user's: a block asks for
// them only while half of each limit, as last seen, stays free.
func TestSparesLeaveHalfTheLimitsFree(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	for _, tc := range []struct {
		name          string
		size, perUser int
	}{
		{"pool", 10, 100},
		{"user", 100, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Prefix: redistest.Prefix(t), Size: tc.size, PerUser: tc.perUser, IdleHold: 10 * time.Second}
			p, _ := newCountedPool(t, s.Addr, cfg)
			holdAndFlush(t, p, admin, cfg.Prefix, "u", 8)
			l, err := p.TryAcquire(context.Background(), "u")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			limit := min(tc.size, tc.perUser)
			all, mine := liveLeases(t, admin, cfg.Prefix, "u")
			if all != mine || all > int64(limit/2) || all < 2 {
				t.Fatalf("after one request of a user that held 8: pool %d, user %d leases; want 2 to %d (spares leave half of %d free)",
					all, mine, limit/2, limit)
			}
		})
	}
}

// After a block call slower than spareMaxCall no spares are asked for:
// each request of the next burst makes its own call.
func TestNoSparesAfterASlowBlock(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	const burst = 5
	cfg := Config{Prefix: redistest.Prefix(t), Size: 100_000, PerUser: 100_000, IdleHold: 10 * time.Second}
	p, cc := newCountedPool(t, s.Addr, cfg)
	holdAndFlush(t, p, admin, cfg.Prefix, "u", 20)
	p.spareMaxCall.Store(0) // every call is slow
	ctx := context.Background()
	first, err := p.TryAcquire(ctx, "u") // its block may still ask for spares: the last call before it was fast
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	p.requestFlush("") // the spares it may have brought go back
	testutil.Eventually(t, 5*time.Second, func() bool {
		all, _ := liveLeases(t, admin, cfg.Prefix, "")
		return p.idleLen() == 0 && all == 1
	}, "only the first request's lease left")
	before := cc.blocks.Load()
	for range burst {
		l, err := p.TryAcquire(ctx, "u")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
	}
	if n := cc.blocks.Load() - before; n != burst {
		t.Fatalf("%d block.lua calls for %d requests one after another after a slow block, want %d (no spares)", n, burst, burst)
	}
}

// Spares that go back unused lower the remembered peak: a trickle of
// requests after a burst asks for spares once, not every time.
func TestUnusedSparesLowerThePeak(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	const peak = 20
	cfg := Config{Prefix: redistest.Prefix(t), Size: 100_000, PerUser: 100_000, IdleHold: 300 * time.Millisecond}
	p, cc := newCountedPool(t, s.Addr, cfg)
	holdAndFlush(t, p, admin, cfg.Prefix, "u", peak)

	ctx := context.Background()
	first, err := p.TryAcquire(ctx, "u") // asks for spares, which nobody takes
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	testutil.Eventually(t, 5*time.Second, func() bool {
		all, _ := liveLeases(t, admin, cfg.Prefix, "")
		return p.idleLen() == 0 && all == 1
	}, "the unused spares back after IdleHold")
	before := cc.blocks.Load()
	second, err := p.TryAcquire(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release()
	if all, _ := liveLeases(t, admin, cfg.Prefix, ""); all != 2 || cc.blocks.Load()-before != 1 {
		t.Fatalf("the next request after %d unused spares: %d leases in Redis, %d block calls; want 2 and 1 (no spares asked for)",
			peak-1, all, cc.blocks.Load()-before)
	}
}

// The remembered peaks are bounded: past maxDemandUsers a new identity is
// not remembered until stale ones can be dropped.
func TestDemandMemoryBounded(t *testing.T) {
	t.Parallel()
	p := &Pool{cfg: Config{IdleHold: DefaultIdleHold}}
	t0 := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range maxDemandUsers + 10 {
		u := fmt.Sprintf("u%d", i)
		p.heldDirectLocked(u, t0)
		p.releasedDirectLocked(u)
	}
	if len(p.demand) != maxDemandUsers || len(p.active) != 0 {
		t.Fatalf("%d peaks remembered, %d identities active; want %d and 0", len(p.demand), len(p.active), maxDemandUsers)
	}
	p.heldDirectLocked("late", t0.Add(demandMemory))
	if len(p.demand) != 1 || p.demand["late"].peak != 1 {
		t.Fatalf("after every peak went stale: %d remembered (late: %+v), want only the new one", len(p.demand), p.demand["late"])
	}
}
