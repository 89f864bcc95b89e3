package upstream

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func newRedisCaps(t *testing.T, rdb redis.UniversalClient, specs []Spec, cfg RedisConfig) *RedisCaps {
	t.Helper()
	c, err := NewRedisCaps(rdb, specs, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newRedisHealth(t *testing.T, rdb redis.UniversalClient, specs []Spec, prefix string, cfg HealthConfig) *RedisHealth {
	t.Helper()
	h, err := NewRedisHealth(rdb, specs, prefix, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func TestRedisCapsTwoProcessesNeverExceedCap(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	specs := []Spec{{Name: "gpu", MaxConcurrency: 3}}
	cfg := RedisConfig{Prefix: redistest.Prefix(t)}
	procs := []*RedisCaps{newRedisCaps(t, srv.Client(t), specs, cfg), newRedisCaps(t, srv.Client(t), specs, cfg)}
	pinger := srv.Client(t)
	var inUse, peak, granted atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := procs[g%2]
			for range 40 {
				s, err := c.TryAcquire(context.Background(), 0)
				if err != nil {
					continue
				}
				n := inUse.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				granted.Add(1)
				// Hold the slot across a round trip so holders overlap.
				_ = pinger.Ping(context.Background()).Err()
				inUse.Add(-1)
				c.Release(s)
			}
		}()
	}
	wg.Wait()
	if peak.Load() > 3 {
		t.Fatalf("peak %d slots held at once, cap 3", peak.Load())
	}
	if peak.Load() < 2 || granted.Load() == 0 {
		t.Fatalf("peak %d, granted %d: the test never loaded the cap", peak.Load(), granted.Load())
	}
	// The count reaches both processes without a call of their own.
	s1, _ := procs[0].TryAcquire(context.Background(), 0)
	s2, _ := procs[0].TryAcquire(context.Background(), 0)
	s3, err := procs[1].TryAcquire(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := procs[1].TryAcquire(context.Background(), 0); err != ErrFull {
		t.Fatalf("fourth slot: %v, want ErrFull", err)
	}
	procs[0].Release(s1)
	testutil.Eventually(t, 10*time.Second, func() bool { return procs[1].Load(0) == 2 }, "release count published to the other process")
	procs[0].Release(s2)
	procs[1].Release(s3)
}

func TestRedisCapsRenewAndDeadHolderExpires(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	specs := []Spec{{Name: "gpu", MaxConcurrency: 1}}
	cfg := RedisConfig{Prefix: redistest.Prefix(t), LeaseTTL: 300 * time.Millisecond}
	alive := newRedisCaps(t, rdb, specs, cfg)
	other := newRedisCaps(t, rdb, specs, cfg)
	ctx := context.Background()
	s, err := alive.TryAcquire(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	key := InFlightKey(cfg.Prefix, "gpu")
	first, err := rdb.ZScore(ctx, key, s.id).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Renewed past its first expiry while its process lives: still held.
	testutil.Eventually(t, 10*time.Second, func() bool {
		sc, err := rdb.ZScore(ctx, key, s.id).Result()
		return err == nil && sc > first+300
	}, "lease renewed beyond its first expiry")
	if _, err := other.TryAcquire(ctx, 0); err != ErrFull {
		t.Fatalf("slot of a live, renewing holder taken: %v", err)
	}
	// The holder dies (stops renewing): its slot comes back within the TTL.
	_ = alive.Close()
	testutil.Eventually(t, 10*time.Second, func() bool {
		s2, err := other.TryAcquire(ctx, 0)
		if err == nil {
			other.Release(s2)
		}
		return err == nil
	}, "dead holder's slot freed")
}

func TestRedisHealthSharedEjectionAndSingleTrial(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	specs := []Spec{{Name: "a"}, {Name: "b"}}
	prefix := redistest.Prefix(t)
	cfg := HealthConfig{MaxFails: 3, Cooldown: 400 * time.Millisecond}
	h1 := newRedisHealth(t, srv.Client(t), specs, prefix, cfg)
	h2 := newRedisHealth(t, srv.Client(t), specs, prefix, cfg)
	ctx := context.Background()
	// Consecutive failures are counted across processes.
	for _, h := range []*RedisHealth{h1, h2} {
		if ej, err := h.Failed(ctx, 0, Failure{Reason: "503"}); err != nil || ej {
			t.Fatalf("early ejection %v %v", ej, err)
		}
	}
	ej, err := h1.Failed(ctx, 0, Failure{Reason: "503"})
	if err != nil || !ej {
		t.Fatalf("third failure: ejected %v, %v", ej, err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return h2.State(0) == Ejected }, "ejection seen by the other process")
	if h2.State(1) != Healthy {
		t.Fatal("the other upstream was affected")
	}
	// A success resets the count: two more failures do not eject b.
	for range 2 {
		_, _ = h1.Failed(ctx, 1, Failure{})
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return h2.ups[1].fails.Load() == 2 }, "failure count seen")
	if _, err := h2.Succeeded(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if ej, _ := h1.Failed(ctx, 1, Failure{}); ej {
		t.Fatal("failures before a success counted as consecutive")
	}

	// Cooldown over: exactly one of many claimants gets the trial.
	testutil.Eventually(t, 10*time.Second, func() bool { return h1.State(0) == Trial && h2.State(0) == Trial }, "trial state in both")
	var wins atomic.Int64
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := h1
			if g%2 == 1 {
				h = h2
			}
			if h.ClaimTrial(ctx, 0) {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d trials granted, want 1", wins.Load())
	}
	back, err := h2.Succeeded(ctx, 0)
	if err != nil || !back {
		t.Fatalf("trial success: back %v, %v", back, err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return h1.State(0) == Healthy }, "return seen by the other process")

	// A 429 sits out its Retry-After at once.
	if ej, _ := h1.Failed(ctx, 1, Failure{SitOut: time.Minute, Reason: "429"}); !ej {
		t.Fatal("429 with Retry-After did not eject")
	}
	ttl, _ := srv.Client(t).PTTL(ctx, DownKey(prefix, "b")).Result()
	if ttl < 55*time.Second {
		t.Fatalf("sit-out TTL %v, want about a minute", ttl)
	}
}

func TestRedisQuotaSharedByProcesses(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	specs := []Spec{{Name: "hosted", RPM: 5, TPM: 1000}}
	prefix := redistest.Prefix(t)
	var qs []*RedisQuota
	for range 2 {
		q, err := NewRedisQuota(srv.Client(t), specs, prefix, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
	}
	ok := 0
	for i := range 12 {
		granted, wait, err := qs[i%2].Reserve(context.Background(), 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if granted {
			ok++
		} else if wait <= 0 {
			t.Fatal("refusal without a wait")
		}
	}
	if ok != 5 {
		t.Fatalf("%d of 12 granted across two processes, want rpm 5", ok)
	}
	if qs[0].degraded.Load() || qs[1].degraded.Load() {
		t.Fatal("quota fell back to local with Redis up")
	}
}

// TestTwoProcessesThreeUpstreamsOneFailing is the fleet scenario on real
// Redis: two balancers (two api processes) share caps and health over three
// mock upstreams capped at 2, one answering 503.
func TestTwoProcessesThreeUpstreamsOneFailing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	mocks := []*mockUpstream{newMock(t), newMock(t), newMock(t)}
	mocks[2].status.Store(503)
	const capacity = 2
	specs := specsFor(mocks, capacity)
	prefix := redistest.Prefix(t)
	var logs logBuffer
	var procs []*Balancer
	for range 2 {
		rdb := srv.Client(t)
		b, err := New(specs, Config{}, Deps{
			NewProvider: openAIProvider,
			Caps:        newRedisCaps(t, rdb, specs, RedisConfig{Prefix: prefix}),
			Health:      newRedisHealth(t, rdb, specs, prefix, HealthConfig{MaxFails: 3, Cooldown: 2 * time.Second}),
			Log:         testLogger(&logs),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		procs = append(procs, b)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := procs[g%2]
			for range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := b.Acquire(ctx, chat("hi"))
				if err == nil {
					var sb strings.Builder
					_, err = r.Stream(ctx, chat("hi"), func(chunk protocol.Chunk) error {
						s := chunk.Content
						sb.WriteString(s)
						return nil
					})
					if err == nil && sb.String() != "hello" {
						err = context.Canceled
					}
				}
				cancel()
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of 100 streams failed; want all done", failed.Load())
	}
	for i, mk := range mocks {
		if p := mk.peak.Load(); p > capacity {
			t.Errorf("upstream %d peaked at %d concurrent calls across both processes, cap %d", i, p, capacity)
		}
	}
	if c := mocks[2].calls.Load(); c < 3 || c > 3+2*capacity {
		t.Fatalf("failing upstream got %d calls; want ejection after 3", c)
	}
	if strings.Count(logs.String(), "upstream: ejected") != 1 {
		t.Fatalf("want one ejection line cluster-wide:\n%s", logs.String())
	}
	// It recovers: after the cooldown one trial call brings it back in both.
	mocks[2].status.Store(200)
	before := mocks[2].calls.Load()
	testutil.Eventually(t, 10*time.Second, func() bool {
		if _, err := collect(context.Background(), procs[0], chat("hi")); err != nil {
			t.Errorf("call during recovery: %v", err)
		}
		return procs[0].health.State(2) == Healthy && procs[1].health.State(2) == Healthy
	}, "failed upstream re-admitted in both processes")
	if mocks[2].calls.Load() <= before || !strings.Contains(logs.String(), "upstream: returned") {
		t.Fatalf("re-admitted without a trial call (calls %d→%d) or without a log line", before, mocks[2].calls.Load())
	}
}

// An adaptive limit lowers a cap in both kinds of caps, never below 1 nor
// above max_concurrency; an upstream without a cap keeps none; a raised
// limit wakes waiters.
func TestCapsSetLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	specs := []Spec{{Name: "gpu", MaxConcurrency: 4}, {Name: "free"}}
	for _, tc := range []struct {
		name string
		caps interface {
			Caps
			SetLimit(i, n int)
		}
	}{
		{"local", NewLocalCaps(specs)},
		{"redis", newRedisCaps(t, srv.Client(t), specs, RedisConfig{Prefix: redistest.Prefix(t)})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.caps
			c.SetLimit(0, 2)
			c.SetLimit(1, 2)
			if c.Limit(0) != 2 || c.Limit(1) != 0 {
				t.Fatalf("limits %d and %d, want 2 and none", c.Limit(0), c.Limit(1))
			}
			s1, err1 := c.TryAcquire(context.Background(), 0)
			s2, err2 := c.TryAcquire(context.Background(), 0)
			if err1 != nil || err2 != nil {
				t.Fatalf("two slots under a limit of 2: %v, %v", err1, err2)
			}
			if _, err := c.TryAcquire(context.Background(), 0); !errors.Is(err, ErrFull) {
				t.Fatalf("third slot under a limit of 2: %v, want ErrFull", err)
			}
			for range 5 {
				s, err := c.TryAcquire(context.Background(), 1)
				if err != nil {
					t.Fatalf("uncapped upstream: %v", err)
				}
				defer c.Release(s)
			}
			woken := c.Changed()
			c.SetLimit(0, 100)
			select {
			case <-woken:
			case <-time.After(5 * time.Second):
				t.Fatal("a raised limit did not wake waiters")
			}
			if c.Limit(0) != 4 {
				t.Fatalf("limit %d after asking 100, want max_concurrency 4", c.Limit(0))
			}
			s3, err := c.TryAcquire(context.Background(), 0)
			if err != nil {
				t.Fatalf("third slot under the raised limit: %v", err)
			}
			c.SetLimit(0, 0)
			if c.Limit(0) != 1 {
				t.Fatalf("limit %d after asking 0, want the floor of 1", c.Limit(0))
			}
			if _, err := c.TryAcquire(context.Background(), 0); !errors.Is(err, ErrFull) {
				t.Fatalf("slot while 3 are held under a limit of 1: %v, want ErrFull", err)
			}
			for _, s := range []Slot{s1, s2, s3} {
				c.Release(s)
			}
		})
	}
}
