package redispool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// A busy Redis is not a dead one. Under load from 40 callers, Redis stops
// answering for a second twice (DEBUG SLEEP 1, as a snapshot fork or a
// slow command does): calls that time out fail alone, as exhausted, and
// nothing switches to the fallback pool; waiters keep their place and are
// all served; no lease or waiter is left behind.
// With idle leases (idle.go) the same holds.
func TestBusyRedisNoFallback(t *testing.T) {
	t.Parallel()
	forIdleHolds(t, testBusyRedisNoFallback)
}

// forIdleHolds runs fn without idle leases and with them
// (DefaultIdleHold), one after the other.
func forIdleHolds(t *testing.T, fn func(*testing.T, time.Duration)) {
	t.Helper()
	for _, hold := range []time.Duration{0, DefaultIdleHold} {
		t.Run(fmt.Sprintf("idle%s", hold), func(t *testing.T) { fn(t, hold) })
	}
}

func testBusyRedisNoFallback(t *testing.T, idleHold time.Duration) {
	s := redistest.Start(t)
	admin := s.Client(t)
	cfg := Config{Prefix: redistest.Prefix(t), Size: 8, PerUser: 8, LeaseTTL: 3 * time.Second, IdleHold: idleHold}
	var fellBack atomic.Int32
	logs := &testutil.LogBuffer{}
	p := newTestPool(t, s.Addr, cfg, slog.New(slog.NewTextHandler(logs, nil)), func(on bool) {
		if on {
			fellBack.Add(1)
		}
	})
	ctx := context.Background()
	stop := make(chan struct{})
	var granted, refused, waited atomic.Int64
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Go(func() {
			user := fmt.Sprintf("u%d", g%4)
			for {
				select {
				case <-stop:
					return
				default:
				}
				var l pool.Lease
				var err error
				if g%2 == 0 {
					l, err = p.TryAcquire(ctx, user)
				} else {
					actx, cancel := context.WithTimeout(ctx, 20*time.Second)
					l, err = p.Acquire(actx, user)
					cancel()
					if err == nil {
						waited.Add(1)
					}
				}
				switch {
				case err == nil:
					granted.Add(1)
					l.Release()
				case errors.Is(err, pool.ErrPoolExhausted), errors.Is(err, pool.ErrUserLimit):
					refused.Add(1)
				default:
					t.Errorf("caller %d: %v", g, err)
					return
				}
			}
		})
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return granted.Load() > 200 }, "load running")
	for range 2 {
		before := granted.Load()
		if err := admin.Do(ctx, "DEBUG", "SLEEP", "1").Err(); err != nil {
			t.Fatalf("DEBUG SLEEP: %v", err)
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return granted.Load() > before+200 }, "grants again after the stall")
	}
	close(stop)
	wg.Wait()
	t.Logf("granted %d (%d after waiting), refused %d", granted.Load(), waited.Load(), refused.Load())
	if n := fellBack.Load(); n != 0 || p.Fallback() {
		t.Fatalf("fell back %d times with Redis busy, not down; log:\n%s", n, logs)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return zcard(t, admin, LeasesKey(cfg.Prefix)) == 0 && zcard(t, admin, WaitersKey(cfg.Prefix)) == 0
	}, "no lease or waiter left behind")
}

// A dead Redis is one: stopped, the Pool falls back on the first refused
// call (no wait for DownAfter), and returns once it is back.
// With idle leases the first TryAcquire may take an idle one: the
// renewal or the release of idle leases finds Redis gone as soon.
func TestStoppedRedisFallsBackAtOnce(t *testing.T) {
	t.Parallel()
	forIdleHolds(t, testStoppedRedisFallsBackAtOnce)
}

func testStoppedRedisFallsBackAtOnce(t *testing.T, idleHold time.Duration) {
	s := redistest.Start(t)
	cfg := Config{Prefix: redistest.Prefix(t), Size: 2, PerUser: 2, LeaseTTL: time.Second, DownAfter: time.Minute, IdleHold: idleHold}
	events := make(chan bool, 10)
	p := newTestPool(t, s.Addr, cfg, nil, func(on bool) { events <- on })
	ctx := context.Background()
	l, err := p.TryAcquire(ctx, "u")
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	s.Stop()
	start := time.Now()
	l, err = p.TryAcquire(ctx, "u")
	if err != nil {
		t.Fatalf("TryAcquire with Redis stopped: %v, want a fallback slot", err)
	}
	l.Release()
	if on := recv(t, events, 10*time.Second, "onFallback(true)"); !on {
		t.Fatal("onFallback(false) first")
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("fallback took %v with DownAfter 1m: a refused connection must count at once", d)
	}
	s.Restart(t)
	if on := recv(t, events, 10*time.Second, "onFallback(false) after the restart"); on {
		t.Fatal("onFallback(true) twice")
	}
}

// Latency is not an outage either. With toxiproxy between the Pool and
// Redis, 20 callers run while every reply is delayed 100–300 ms, then for
// 1.5 s by 1.2 s (beyond the 500 ms call timeout and the 1 s probe
// timeout, well within the test's DownAfter of 8 s): calls time out and fail alone,
// the probe answers again once the stall ends, nothing falls back, and
// grants resume.
func TestLatencyNoFallback(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	px := startProxy(t, s.Addr)
	// DownAfter well above the stall: on a loaded machine the probe's own
	// redial through the proxy adds to it.
	cfg := Config{Prefix: redistest.Prefix(t), Size: 6, PerUser: 6, LeaseTTL: 3 * time.Second, DownAfter: 8 * time.Second}
	var fellBack atomic.Int32
	p := newTestPool(t, px.Listen, cfg, nil, func(on bool) {
		if on {
			fellBack.Add(1)
		}
	})
	ctx := context.Background()
	addLatency(t, px, "slow", 200, 100)
	stop := make(chan struct{})
	var granted, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := p.TryAcquire(ctx, fmt.Sprintf("u%d", g%3))
				switch {
				case err == nil:
					granted.Add(1)
					l.Release()
				case errors.Is(err, pool.ErrPoolExhausted), errors.Is(err, pool.ErrUserLimit):
					refused.Add(1)
				default:
					t.Errorf("caller %d: %v", g, err)
					return
				}
			}
		})
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return granted.Load() > 20 }, "grants through the slow proxy")
	if err := px.Toxics.RemoveToxic(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	addLatency(t, px, "stall", 1200, 0)
	<-time.After(1500 * time.Millisecond) // the length of the stall, not a wait for a condition
	if err := px.Toxics.RemoveToxic(ctx, "stall"); err != nil {
		t.Fatal(err)
	}
	before := granted.Load()
	testutil.Eventually(t, 20*time.Second, func() bool { return granted.Load() > before+50 }, "grants after the stall")
	close(stop)
	wg.Wait()
	t.Logf("granted %d, refused %d", granted.Load(), refused.Load())
	if n := fellBack.Load(); n != 0 {
		t.Fatalf("fell back %d times on a slow Redis", n)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return zcard(t, admin, LeasesKey(cfg.Prefix)) == 0 }, "no lease left behind")
}

// An acquire whose caller gave up while Redis ran its block anyway must
// not leave a lease held by nobody until it expires: the block's reply
// still comes (a slow Redis is waited for), and what it granted to callers
// that left goes back in the next block. Three acquires of one identity
// (limit 3) give up after 300 ms behind 700 ms of latency; once it is
// gone the identity gets its slots back at once, not after the 30 s
// lease TTL.
func TestTimedOutAcquireLeavesNoLease(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	px := startProxy(t, s.Addr)
	c := redis.NewClient(&redis.Options{Addr: px.Listen, ContextTimeoutEnabled: true})
	cfg := Config{Prefix: redistest.Prefix(t), Size: 10, PerUser: 3, LeaseTTL: 30 * time.Second, DownAfter: time.Minute}
	p, err := New(cfg, c, testutil.DiscardLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(p.Close)
	ctx := context.Background()
	// Open connections first, so the scripts reach Redis: a dial behind
	// the latency would time out before sending anything.
	var warm sync.WaitGroup
	for range 6 {
		warm.Go(func() {
			if err := c.Do(ctx, "DEBUG", "SLEEP", "0.2").Err(); err != nil {
				t.Errorf("warm-up: %v", err)
			}
		})
	}
	warm.Wait()
	wl, err := p.TryAcquire(ctx, "warm") // loads the script: EVALSHA then finds it
	if err != nil {
		t.Fatal(err)
	}
	wl.Release()
	addLatency(t, px, "slow", 700, 0)
	var calls sync.WaitGroup
	for i := range 3 {
		calls.Go(func() {
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			if _, err := p.TryAcquire(actx, "u"); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("acquire %d behind 700 ms, given up after 300 ms: %v, want the caller's deadline", i, err)
			}
		})
	}
	calls.Wait()
	// Redis ran the block at once (the latency is on its replies).
	if n := zcard(t, admin, LeasesKey(cfg.Prefix)); n == 0 {
		t.Fatal("no lease granted behind the latency: the test would prove nothing")
	}
	if err := px.Toxics.RemoveToxic(ctx, "slow"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.Eventually(t, 20*time.Second, func() bool { return zcard(t, admin, LeasesKey(cfg.Prefix)) == 0 }, "leases of abandoned acquires removed")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("leases held by nobody for %v, want them back with the next block", d)
	}
	l, err := p.TryAcquire(ctx, "u")
	if err != nil {
		t.Fatalf("identity after the stall: %v", err)
	}
	l.Release()
}

// startProxy runs a toxiproxy in front of addr until the test ends.
func startProxy(t *testing.T, addr string) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	px := toxiproxy.NewProxy(srv, "pool", "127.0.0.1:0", addr)
	if err := px.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(px.Stop)
	return px
}

// addLatency delays every reply through px by latency ± jitter ms.
func addLatency(t *testing.T, px *toxiproxy.Proxy, name string, latency, jitter int) {
	t.Helper()
	_, err := px.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
		`{"name":%q,"type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, name, latency, jitter)))
	if err != nil {
		t.Fatalf("add toxic %s: %v", name, err)
	}
}
