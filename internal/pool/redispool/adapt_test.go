package redispool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// adapt.lua follows adaptive.State.Apply, report for report, on
// miniredis's hand-set clock.
func TestAdaptScriptFollowsTheRule(t *testing.T) {
	t.Parallel()
	p, m := newMiniPool(t, Config{Size: 10, PerUser: 10})
	params := adaptive.Params{Floor: 2, Ceiling: 10, Interval: time.Second}
	reports := []struct {
		at time.Duration
		r  adaptive.Report
	}{
		{0, adaptive.Report{}},
		{1100 * time.Millisecond, adaptive.Report{Calls: 5}},
		{1200 * time.Millisecond, adaptive.Report{Throttle: true}},
		{1300 * time.Millisecond, adaptive.Report{Throttle: true}},
		{2150 * time.Millisecond, adaptive.Report{Calls: 3}},
		{2200 * time.Millisecond, adaptive.Report{Throttle: true}},
		{3250 * time.Millisecond, adaptive.Report{Calls: 4}},
		{4300 * time.Millisecond, adaptive.Report{Calls: 4}},
		{5400 * time.Millisecond, adaptive.Report{}},
		{6500 * time.Millisecond, adaptive.Report{Calls: 1}},
		{6600 * time.Millisecond, adaptive.Report{Throttle: true}},
		{20 * time.Second, adaptive.Report{Calls: 9}},
		{21 * time.Second, adaptive.Report{Calls: 1, Throttle: true}},
		{22 * time.Second, adaptive.Report{Calls: 1}},
		{23 * time.Second, adaptive.Report{Calls: 1}},
		{30 * time.Second, adaptive.Report{Calls: 1}},
		{40 * time.Second, adaptive.Report{Calls: 1}},
	}
	var ref adaptive.State
	seen := map[int]bool{}
	for i, rep := range reports {
		at := miniEpoch.Add(rep.at)
		m.SetTime(at)
		got, err := p.Report(t.Context(), "global", rep.r, params)
		if err != nil {
			t.Fatal(err)
		}
		ref.Apply(rep.r, at, params)
		if got != ref.Limit {
			t.Fatalf("report %d (%+v at %s): Redis says %d, the rule %d", i, rep.r, rep.at, got, ref.Limit)
		}
		seen[got] = true
	}
	if len(seen) < 4 {
		t.Errorf("the reports reached only the limits %v: too few to compare", seen)
	}
	if ttl := m.TTL(LimitKey(DefaultPrefix, "global")); ttl <= 0 {
		t.Errorf("limit key TTL %s, want one", ttl)
	}
	// Bad names and params are refused before Redis.
	for _, name := range []string{"", "a{b}"} {
		if _, err := p.Report(t.Context(), name, adaptive.Report{}, params); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	if _, err := p.Report(t.Context(), "global", adaptive.Report{}, adaptive.Params{}); err == nil {
		t.Error("zero params accepted")
	}
}

// The adaptive limit in Redis binds the pool of every process sharing it:
// a throttle reported by one process lowers what the others grant, held
// leases stay, and the limit growing back wakes a waiter elsewhere.
func TestAdaptiveLimitClusterWide(t *testing.T) {
	t.Parallel()
	forTargets(t, testAdaptiveLimitClusterWide)
}

func testAdaptiveLimitClusterWide(t *testing.T, s target) {
	cfg := Config{Prefix: redistest.Prefix(t), Size: 8, PerUser: 8, LeaseTTL: 5 * time.Second, AdaptiveLimit: "global"}
	ctx := context.Background()
	reporter := newTestPoolOn(t, s, cfg, nil, nil)
	other := newTestPoolOn(t, s, cfg, nil, nil)
	other.recheck = time.Hour // only the notification may wake its waiter
	params := adaptive.Params{Floor: 1, Ceiling: 8, Interval: 200 * time.Millisecond}

	var held []pool.Lease
	for range 3 {
		l, err := other.TryAcquire(ctx, "u")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	// 8 → 4 → 2: two throttles an interval apart.
	if n, err := reporter.Report(ctx, "global", adaptive.Report{Throttle: true}, params); err != nil || n != 4 {
		t.Fatalf("first throttle: %d, %v; want 4", n, err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, err := reporter.Report(ctx, "global", adaptive.Report{Throttle: true}, params)
		return err == nil && n == 2
	}, "a second halving an interval later")
	if _, err := other.TryAcquire(ctx, "u"); !errors.Is(err, pool.ErrPoolExhausted) {
		t.Fatalf("3 held over a limit of 2: TryAcquire %v, want ErrPoolExhausted", err)
	}
	if st := other.Stats(); st.Limit != 2 || st.Capacity != 8 || st.Effective() != 2 {
		t.Errorf("stats of the other process %+v, want limit 2 of 8", st)
	}
	// Two released: one in use, under the limit again.
	held[0].Release()
	held[1].Release()
	l, err := other.TryAcquire(ctx, "u")
	if err != nil {
		t.Fatalf("one held of a limit of 2: %v", err)
	}
	held = []pool.Lease{held[2], l}

	type got struct {
		l   pool.Lease
		err error
	}
	ch := make(chan got, 1)
	go func() {
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := other.Acquire(actx, "w")
		ch <- got{l, err}
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return zcard(t, s.client(t), WaitersKey(cfg.Prefix)) == 1 }, "a waiter")
	// A healthy interval with calls: +1, announced to every process.
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, err := reporter.Report(ctx, "global", adaptive.Report{Calls: 1}, params)
		return err == nil && n == 3
	}, "the limit growing to 3")
	g := recv(t, ch, 5*time.Second, "the waiter served when the limit grew")
	if g.err != nil {
		t.Fatal(g.err)
	}
	g.l.Release()
	for _, l := range held {
		l.Release()
	}
}

// Without AdaptiveLimit a limit left in Redis is not read. The script is
// run directly, so a slow machine's fallback cannot stand in for Redis.
func TestAdaptiveLimitOffIgnoresKey(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	prefix := redistest.Prefix(t)
	on := newTestPool(t, s.Addr, Config{Prefix: prefix, Size: 4, PerUser: 4, AdaptiveLimit: "global"}, nil, nil)
	off := newTestPool(t, s.Addr, Config{Prefix: prefix, Size: 4, PerUser: 4}, nil, nil)
	if n, err := on.Report(t.Context(), "global", adaptive.Report{Throttle: true}, adaptive.Params{Floor: 1, Ceiling: 4, Interval: time.Hour}); err != nil || n != 2 {
		t.Fatalf("throttle: %d, %v", n, err)
	}
	for i := range 4 {
		rep, err := off.runAcquire(t.Context(), "u", newID(), "", 0)
		if err != nil || rep.code != codeGranted || rep.size != 4 {
			t.Fatalf("acquire %d with adaptive off: %+v, %v; want granted of 4", i, rep, err)
		}
	}
	rep, err := on.runAcquire(t.Context(), "v", newID(), "", 0)
	if err != nil || rep.code != codeExhausted || rep.size != 2 {
		t.Fatalf("adaptive pool with 4 held of a limit of 2: %+v, %v; want exhausted at 2", rep, err)
	}
	if st := on.Stats(); st.Limit != 2 {
		t.Errorf("stats %+v, want the limit the script applied", st)
	}
}
