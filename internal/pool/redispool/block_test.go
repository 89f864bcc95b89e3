package redispool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Slot blocks (block.go) against a real redis-server.

// A slow Redis is not a full pool. Every reply from Redis is delayed
// 250 ± 50 ms (toxiproxy), as a primary busy with other work answers
// under load; 1000 callers (200 identities, 5 each, PerUser 5: the
// per-user limit is reached but never passed) each take a direct slot,
// hold it and give it back, three times, with 100,000 slots free. Not one
// is refused, nothing falls back, the pool's primary sees a call per
// block rather than per stream, and no lease is left behind. DownAfter is
// a minute: the latency is the test's, not the machine's. On two loaded
// cores under the race detector the probe's PING through the same proxy
// went unanswered for the default 3 s, and the pool then rightly judged
// Redis gone and served the 10 slots of its fallback pool (18 of 30 runs
// under load refused hundreds of callers). The claim does not rest on
// that verdict: a block slower than callTimeout is waited for, and a
// Redis that answers is not taken for a full or a gone one.
func TestSlowRedisIsNotAFullPool(t *testing.T) {
	t.Parallel()
	forIdleHolds(t, testSlowRedisIsNotAFullPool)
}

func testSlowRedisIsNotAFullPool(t *testing.T, idleHold time.Duration) {
	s := redistest.Start(t)
	admin := s.Client(t)
	px := startProxy(t, s.Addr)
	const callers, users, rounds = 1000, 200, 3
	cfg := Config{Prefix: redistest.Prefix(t), Size: 100_000, PerUser: callers / users, LeaseTTL: 30 * time.Second, IdleHold: idleHold, DownAfter: time.Minute}
	c := redis.NewClient(&redis.Options{Addr: px.Listen})
	cc := &callCounter{}
	c.AddHook(cc)
	var fellBack atomic.Int32
	log, logs := testutil.NewLog(t)
	p, err := New(cfg, c, log, func(on bool) {
		if on {
			fellBack.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(p.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pool log:\n%s", logs)
		}
	})
	ctx := context.Background()
	if l, err := p.TryAcquire(ctx, "warm"); err != nil { // loads the script
		t.Fatal(err)
	} else {
		l.Release()
	}
	addLatency(t, px, "slow", 250, 50)

	var granted, refused, maxWait atomic.Int64
	var held atomic.Int64
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			user := fmt.Sprintf("u%d", g%users)
			for range rounds {
				start := time.Now()
				l, err := p.TryAcquire(ctx, user)
				if err != nil {
					if refused.Add(1) <= 5 {
						t.Errorf("caller %d with %d slots free: %v", g, cfg.Size-int(held.Load()), err)
					}
					return
				}
				w := time.Since(start).Milliseconds()
				for m := maxWait.Load(); w > m && !maxWait.CompareAndSwap(m, w); m = maxWait.Load() {
				}
				granted.Add(1)
				held.Add(1)
				<-time.After(20 * time.Millisecond) // the stream holding its slot
				held.Add(-1)
				l.Release()
			}
		})
	}
	wg.Wait()
	blocks := cc.blocks.Load()
	t.Logf("%d granted, %d refused; %d block.lua calls for %d streams (acquire and release); longest acquire %d ms",
		granted.Load(), refused.Load(), blocks, granted.Load(), maxWait.Load())
	if granted.Load() != callers*rounds {
		t.Fatalf("granted %d of %d", granted.Load(), callers*rounds)
	}
	if n := fellBack.Load(); n != 0 {
		t.Fatalf("fell back %d times on a slow Redis", n)
	}
	// Without blocks each stream costs an acquire and a release call:
	// 2 × callers × rounds. Idle leases save some; blocks most of them.
	if blocks*10 > granted.Load() {
		t.Errorf("%d block.lua calls for %d streams: not a call per block", blocks, granted.Load())
	}
	if err := px.Toxics.RemoveToxic(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if n := zcard(t, admin, LeasesKey(cfg.Prefix)); n != 0 {
		t.Fatalf("%d leases left after Close", n)
	}
}

// Blocks hold both limits exactly (Size 5, PerUser 3). First 20 direct
// requests of one identity arrive at once: exactly 3 are granted, the
// others refused for the identity's share. Then 40 of two other
// identities: exactly the 2 slots left are granted, the others refused,
// some for the full pool. Every grant stays held until the end.
func TestBlockLimitsExact(t *testing.T) {
	t.Parallel()
	forTargets(t, testBlockLimitsExact)
}

func testBlockLimitsExact(t *testing.T, tg target) {
	admin := tg.client(t)
	const size, perUser = 5, 3
	cfg := Config{Prefix: redistest.Prefix(t), Size: size, PerUser: perUser, LeaseTTL: 10 * time.Second}
	p := newTestPoolOn(t, tg, cfg, nil, nil)
	ctx := context.Background()
	var leases []pool.Lease
	burst := func(users []string, each int) (granted map[string]int, full, userLimit int) {
		var mu sync.Mutex
		granted = map[string]int{}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, user := range users {
			for range each {
				wg.Go(func() {
					<-start
					l, err := p.TryAcquire(ctx, user)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						granted[user]++
						leases = append(leases, l)
					case errors.Is(err, pool.ErrUserLimit):
						userLimit++
					case errors.Is(err, pool.ErrPoolExhausted):
						full++
					default:
						t.Errorf("%s: %v", user, err)
					}
				})
			}
		}
		close(start)
		wg.Wait()
		return granted, full, userLimit
	}

	got, full, userLimit := burst([]string{"u0"}, 20)
	t.Logf("one identity: granted %v; refused %d (pool) and %d (identity)", got, full, userLimit)
	if got["u0"] != perUser || userLimit != 20-perUser || full != 0 {
		t.Errorf("one identity, 20 at once: granted %d, refused %d for the identity and %d for the pool; want %d, %d, 0",
			got["u0"], userLimit, full, perUser, 20-perUser)
	}
	got, full, userLimit = burst([]string{"u1", "u2"}, 20)
	t.Logf("two more: granted %v; refused %d (pool) and %d (identity)", got, full, userLimit)
	if n := got["u1"] + got["u2"]; n != size-perUser || full+userLimit != 40-n || full == 0 {
		t.Errorf("two identities, 40 at once: granted %d, refused %d for the pool and %d for an identity; want %d granted, the rest refused, some for the pool",
			n, full, userLimit, size-perUser)
	}
	if n := zcard(t, admin, LeasesKey(cfg.Prefix)); n != size {
		t.Errorf("%d leases in Redis, want %d", n, size)
	}
	for _, l := range leases {
		l.Release()
	}
	if n := zcard(t, admin, LeasesKey(cfg.Prefix)); n != 0 {
		t.Errorf("%d leases in Redis after every Release returned", n)
	}
}

// A block waits for a slow Redis only up to DownAfter: behind 8 s of
// latency with DownAfter 400 ms (the probe's PING is as slow, so the
// watch finds Redis gone), direct requests are served from the fallback
// pool rather than left waiting, and what the late block granted goes
// back once Redis answers. The stall is long so that the bound on the
// request (5 s: callTimeout, DownAfter and the fallback slot, with room
// for two loaded cores under the race detector) still tells a verdict
// from the block's reply; behind 1.5 s of latency the bound had to be
// 1.4 s, and a loaded machine crossed it.
func TestBlockBoundedByDownAfter(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	px := startProxy(t, s.Addr)
	cfg := Config{Prefix: redistest.Prefix(t), Size: 10, PerUser: 10, LeaseTTL: 3 * time.Second, DownAfter: 400 * time.Millisecond}
	events := make(chan bool, 10)
	c := redis.NewClient(&redis.Options{Addr: px.Listen})
	p, err := New(cfg, c, testutil.DiscardLogger(), func(on bool) { events <- on })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(p.Close)
	ctx := context.Background()
	if l, err := p.TryAcquire(ctx, "warm"); err != nil {
		t.Fatal(err)
	} else {
		l.Release()
	}
	const stall = 8 * time.Second
	addLatency(t, px, "stall", int(stall/time.Millisecond), 0)
	start := time.Now()
	l, err := p.TryAcquire(ctx, "u")
	if err != nil {
		t.Fatalf("TryAcquire behind a stalled Redis: %v, want a fallback slot", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("TryAcquire took %v, want about DownAfter (%v), not the stall (%v)", d, cfg.DownAfter, stall)
	}
	l.Release()
	if on := recv(t, events, 30*time.Second, "onFallback(true)"); !on {
		t.Fatal("onFallback(false) first")
	}
	if err := px.Toxics.RemoveToxic(ctx, "stall"); err != nil {
		t.Fatal(err)
	}
	if on := recv(t, events, 30*time.Second, "onFallback(false)"); on {
		t.Fatal("onFallback(true) twice")
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return zcard(t, admin, LeasesKey(cfg.Prefix)) == 0 },
		"the late block's lease given back")
}

// Waiters tried in blocks (wait.go, block.lua) hold every limit exactly:
// Size 8 lowered to 4 by the adaptive limit, PerUser 2, two processes,
// 24 waiters of 4 identities (u0 has 9, the others 5, so at the end u0's
// alone wait with slots free) spread over both, in line behind a full
// pool. Once all are registered the 4 holders let go: the first 4 grants
// go to 4 different identities (each holds none, so each one's oldest
// waiter comes first) and stay held while the others wait; then every
// waiter is served. At no grant do the holders count more than 4 slots,
// or 2 for one identity, and Redis, sampled throughout, agrees.
func TestWaiterBlocksLimitsExact(t *testing.T) {
	t.Parallel()
	forTargets(t, testWaiterBlocksLimitsExact)
}

func testWaiterBlocksLimitsExact(t *testing.T, tg target) {
	admin := tg.client(t)
	const size, limit, perUser, users, waiters = 8, 4, 2, 4, 24
	cfg := Config{Prefix: redistest.Prefix(t), Size: size, PerUser: perUser, LeaseTTL: 10 * time.Second, AdaptiveLimit: "global"}
	cc := &callCounter{}
	counted := target{tg.name, func(tb testing.TB) redis.UniversalClient {
		c := tg.client(tb)
		c.AddHook(cc)
		return c
	}}
	pools := []*Pool{newTestPoolOn(t, counted, cfg, nil, nil), newTestPoolOn(t, counted, cfg, nil, nil)}
	ctx := context.Background()
	params := adaptive.Params{Floor: 1, Ceiling: size, Interval: time.Hour}
	if n, err := pools[0].Report(ctx, "global", adaptive.Report{Throttle: true}, params); err != nil || n != limit {
		t.Fatalf("throttle: limit %d, %v; want %d", n, err, limit)
	}
	var holders []pool.Lease
	for i := range limit {
		l, err := pools[i%2].TryAcquire(ctx, fmt.Sprintf("h%d", i))
		if err != nil {
			t.Fatalf("holder %d: %v", i, err)
		}
		holders = append(holders, l)
	}

	var mu sync.Mutex
	held := map[string]int{} // by identity, counted by the holders
	total := 0
	var order []string // identities in order of grant
	release := make(chan struct{})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for u := range users {
		each := 5
		if u == 0 {
			each = waiters - 5*(users-1)
		}
		for k := range each {
			user, p := fmt.Sprintf("u%d", u), pools[(u+k)%2]
			wg.Go(func() {
				l, err := p.AcquireSince(wctx, user, time.Now())
				if err != nil {
					t.Errorf("%s: %v", user, err)
					return
				}
				mu.Lock()
				held[user]++
				total++
				order = append(order, user)
				if total > limit || held[user] > perUser {
					t.Errorf("at a grant to %s: %d slots held (limit %d), %d by %s (PerUser %d)", user, total, limit, held[user], user, perUser)
				}
				first := len(order) <= limit
				mu.Unlock()
				if first {
					<-release
				} else {
					<-time.After(2 * time.Millisecond) // the stream holding its slot
				}
				mu.Lock()
				held[user]--
				total--
				mu.Unlock()
				l.Release()
			})
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return zcard(t, admin, WaitersKey(cfg.Prefix)) == waiters
	}, "every waiter in line")
	blocks := cc.blocks.Load()
	for _, l := range holders {
		l.Release()
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == limit
	}, "the first wave granted")
	mu.Lock()
	first := slices.Clone(order)
	mu.Unlock()
	slices.Sort(first)
	if len(slices.Compact(slices.Clone(first))) != limit {
		t.Errorf("first wave %v: want %d different identities (round-robin)", first, limit)
	}
	if n := zcard(t, admin, LeasesKey(cfg.Prefix)); n != limit {
		t.Errorf("%d leases in Redis with the first wave held, want %d", n, limit)
	}
	if n := zcard(t, admin, WaitersKey(cfg.Prefix)); n != waiters-limit {
		t.Errorf("%d waiters in line with the first wave held, want %d", n, waiters-limit)
	}

	done := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			all, _ := liveLeases(t, admin, cfg.Prefix, "")
			if all > limit {
				t.Errorf("%d live leases in Redis, limit %d", all, limit)
				return
			}
			for u := range users {
				if _, mine := liveLeases(t, admin, cfg.Prefix, fmt.Sprintf("u%d", u)); mine > perUser {
					t.Errorf("u%d holds %d live leases in Redis, PerUser %d", u, mine, perUser)
					return
				}
			}
		}
	})
	close(release)
	wg.Wait()
	close(done)
	sampler.Wait()
	t.Logf("%d grants; %d block.lua calls from the first release on", len(order), cc.blocks.Load()-blocks)
	if len(order) != waiters {
		t.Fatalf("%d of %d waiters served", len(order), waiters)
	}
	if n := zcard(t, admin, LeasesKey(cfg.Prefix)); n != 0 {
		t.Errorf("%d leases left after every Release returned", n)
	}
}
