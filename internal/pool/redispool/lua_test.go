package redispool

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Fast checks of the scripts and the key layout on miniredis, with its
// clock set by hand. Behaviour over real time, Pub/Sub and outages is
// proved against redis-server in redispool_test.go.

// miniEpoch is miniredis's clock at the start of each test.
var miniEpoch = time.Unix(1_800_000_000, 0)

func newMiniPool(t *testing.T, cfg Config) (*Pool, *miniredis.Miniredis) {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(miniEpoch)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	p, err := New(cfg, c, testutil.DiscardLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, m
}

func TestKeysShareOneHashTag(t *testing.T) {
	t.Parallel()
	const prefix = "t:xyz:"
	for _, c := range []struct{ got, want string }{
		{LeasesKey(prefix), "t:xyz:{pool}:leases"},
		{UserKey(prefix, "alice"), "t:xyz:{pool}:user:alice"},
		{WaitersKey(prefix), "t:xyz:{pool}:waiters"},
		{WaiterExpiryKey(prefix), "t:xyz:{pool}:waiters:expiry"},
		{NotifyChannel(prefix), "t:xyz:{pool}:notify"},
		{LeasesKey(DefaultPrefix), "pool:{pool}:leases"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
		if tag := c.got[strings.Index(c.got, "{") : strings.Index(c.got, "}")+1]; tag != "{pool}" {
			t.Errorf("%q: first hash tag %q", c.got, tag)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{Size: 1, PerUser: 1}
	if err := ok.withDefaults().Validate(); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	for name, cfg := range map[string]Config{
		"no size":        {PerUser: 1},
		"no per-user":    {Size: 1},
		"brace prefix":   {Size: 1, PerUser: 1, Prefix: "{x}:"},
		"short ttl":      {Size: 1, PerUser: 1, LeaseTTL: 10 * time.Millisecond},
		"fractional ttl": {Size: 1, PerUser: 1, LeaseTTL: time.Second + time.Microsecond},
		"negative fb":    {Size: 1, PerUser: 1, FallbackSize: -1},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, cfg)
		}
		if _, err := New(cfg, redis.NewClient(&redis.Options{}), nil, nil); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
	if _, err := New(ok, nil, nil, nil); err == nil {
		t.Error("New accepted a nil client")
	}
}

// Each field out of range is a *bounds.Error naming it, all reported
// together; the edge values pass.
func TestConfigValidateBounds(t *testing.T) {
	t.Parallel()
	edge := Config{Size: 1, PerUser: 1, LeaseTTL: minLeaseTTL, FallbackSize: 1, IdleHold: 0, DownAfter: minDownAfter}
	if err := edge.Validate(); err != nil {
		t.Fatalf("edge values: %v", err)
	}
	bad := Config{Size: 0, PerUser: 0, LeaseTTL: minLeaseTTL - time.Millisecond, FallbackSize: 0, IdleHold: -1, DownAfter: minDownAfter - 1}
	err := bad.Validate()
	for _, field := range []string{"Size", "PerUser", "LeaseTTL", "FallbackSize", "IdleHold", "DownAfter"} {
		if !testutil.HasBound(err, field) {
			t.Errorf("Validate() = %v, want a bounds error for %s", err, field)
		}
	}
	if n := len(bounds.Errors(err)); n != 6 {
		t.Errorf("Validate() reported %d bounds errors, want 6: %v", n, err)
	}
	if _, err := New(Config{Size: 1, PerUser: 1}, redis.NewClient(&redis.Options{}), nil, nil); err != nil {
		t.Errorf("New with the zero fields that have defaults: %v", err)
	}
}

func TestLuaLeaseLayoutAndExpiry(t *testing.T) {
	t.Parallel()
	p, m := newMiniPool(t, Config{Prefix: "t:xyz:", Size: 2, PerUser: 1, LeaseTTL: 10 * time.Second, Holder: "api-1"})
	ctx := context.Background()
	now := miniEpoch

	l, err := p.TryAcquire(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	id := l.(*lease).id
	if !strings.HasPrefix(id, "api-1/") {
		t.Errorf("lease id %q does not name its holder", id)
	}
	wantExp := float64(now.Add(10 * time.Second).UnixMilli())
	for _, key := range []string{"t:xyz:{pool}:leases", "t:xyz:{pool}:user:alice"} {
		if s, err := m.ZScore(key, id); err != nil || s != wantExp {
			t.Errorf("%s: score %v (%v), want expiry %v", key, s, err, wantExp)
		}
		if ttl := m.TTL(key); ttl != 30*time.Second {
			t.Errorf("%s: TTL %v, want 3 lease TTLs", key, ttl)
		}
	}
	if _, err := p.TryAcquire(ctx, "alice"); !errors.Is(err, pool.ErrUserLimit) {
		t.Fatalf("second for alice: %v, want ErrUserLimit", err)
	}
	if _, err := p.TryAcquire(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.TryAcquire(ctx, "carol"); !errors.Is(err, pool.ErrPoolExhausted) {
		t.Fatalf("third: %v, want ErrPoolExhausted", err)
	}
	// Past the expiry both leases are gone, from the user sets too.
	m.SetTime(now.Add(10*time.Second + time.Millisecond))
	if _, err := p.TryAcquire(ctx, "alice"); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if members, _ := m.ZMembers("t:xyz:{pool}:user:alice"); len(members) != 1 || slices.Contains(members, id) {
		t.Errorf("alice's set %v still holds the expired lease", members)
	}
	// Releasing the expired lease late must not free the new one.
	l.Release()
	if n, _ := m.ZMembers("t:xyz:{pool}:leases"); len(n) != 1 {
		t.Errorf("leases after late release: %v", n)
	}
}

// The fairness rule of the package doc, step by step.
func TestLuaWaitersEligibility(t *testing.T) {
	t.Parallel()
	p, m := newMiniPool(t, Config{Prefix: "t:w:", Size: 3, PerUser: 1, LeaseTTL: 10 * time.Second})
	ctx := context.Background()
	code := func(user, member string) int64 {
		t.Helper()
		rep, err := p.runAcquire(ctx, user, newID(), member, 0)
		if err != nil {
			t.Fatal(err)
		}
		return rep.code
	}
	waiter := func(user string) string { return newID() + ":" + user }
	now := miniEpoch
	tick := func(d time.Duration) { now = now.Add(d); m.SetTime(now) }

	if c := code("a", ""); c != codeGranted { // a holds 1 of 3
		t.Fatalf("a: %d", c)
	}
	if c := code("h", ""); c != codeGranted { // 2 of 3
		t.Fatalf("h: %d", c)
	}
	// wa waits on its own user limit: registered, and blocks nobody.
	wa := waiter("a")
	if c := code("a", wa); c != codeUserLimit {
		t.Fatalf("wa: %d, want user limit", c)
	}
	if n, _ := m.ZMembers("t:w:{pool}:waiters"); len(n) != 1 {
		t.Fatalf("waiters %v", n)
	}
	tick(time.Millisecond)
	if c := code("x", ""); c != codeGranted { // 3 of 3, past an ineligible waiter
		t.Fatalf("direct past ineligible waiter: %d", c)
	}
	if c := code("y", ""); c != codeExhausted {
		t.Fatalf("full: %d", c)
	}
	// Two eligible waiters queue behind wa.
	wb, wc := waiter("b"), waiter("c")
	tick(time.Millisecond)
	if c := code("b", wb); c != codeExhausted {
		t.Fatalf("wb: %d", c)
	}
	tick(time.Millisecond)
	if c := code("c", wc); c != codeExhausted {
		t.Fatalf("wc: %d", c)
	}
	// Free one slot (x's): it belongs to wb, the oldest eligible waiter.
	if _, err := m.ZRem("t:w:{pool}:leases", firstNot(t, m, "t:w:{pool}:leases", "t:w:{pool}:user:a", "t:w:{pool}:user:h")); err != nil {
		t.Fatal(err)
	}
	if c := code("d", ""); c != codeReserved {
		t.Fatalf("direct with 1 free and 2 eligible waiters: %d, want reserved", c)
	}
	if c := code("c", wc); c != codeExhausted {
		t.Fatalf("wc before wb: %d, want exhausted", c)
	}
	if c := code("b", wb); c != codeGranted {
		t.Fatalf("wb: %d, want granted", c)
	}
	if n, _ := m.ZMembers("t:w:{pool}:waiters"); !slices.Equal(n, []string{wa, wc}) {
		t.Fatalf("waiters after wb %v", n)
	}
	if n, _ := m.ZMembers("t:w:{pool}:waiters:expiry"); !slices.Equal(n, []string{wa, wc}) {
		t.Fatalf("waiter expiry after wb %v", n)
	}
	// A waiter whose process stopped refreshing it drops out.
	tick(10*time.Second + time.Millisecond)
	if c := code("z", ""); c != codeGranted { // all leases expired too
		t.Fatalf("after expiry: %d", c)
	}
	if n, _ := m.ZMembers("t:w:{pool}:waiters"); len(n) != 0 {
		t.Fatalf("expired waiters still there: %v", n)
	}
}

func TestLuaRenewReportsLost(t *testing.T) {
	t.Parallel()
	p, m := newMiniPool(t, Config{Prefix: "t:r:", Size: 5, PerUser: 5, LeaseTTL: 10 * time.Second})
	ctx := context.Background()
	start := miniEpoch
	ids := map[string]string{}
	for _, u := range []string{"a", "b"} {
		id := newID()
		if rep, err := p.runAcquire(ctx, u, id, "", 0); err != nil || rep.code != codeGranted {
			t.Fatal(rep, err)
		}
		ids[id] = u
	}
	w := newID() + ":c"
	if rep, err := p.runAcquire(ctx, "c", newID(), w, 0); err != nil || rep.code != codeGranted {
		t.Fatal(rep, err) // granted at once, so not registered any more
	}
	m.SetTime(start.Add(5 * time.Second))
	lost, lostW, err := p.runRenew(ctx, ids, []string{w})
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 0 || !slices.Equal(lostW, []string{w}) {
		t.Fatalf("lost %v %v", lost, lostW)
	}
	for id, u := range ids {
		want := float64(start.Add(15 * time.Second).UnixMilli())
		if s, _ := m.ZScore("t:r:{pool}:leases", id); s != want {
			t.Errorf("renewed expiry %v, want %v", s, want)
		}
		if s, _ := m.ZScore("t:r:{pool}:user:"+u, id); s != want {
			t.Errorf("renewed user expiry %v, want %v", s, want)
		}
	}
	// 15.001s: expired; renewal must not revive them.
	m.SetTime(start.Add(15*time.Second + time.Millisecond))
	lost, _, err = p.runRenew(ctx, ids, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 2 {
		t.Fatalf("lost %v, want both", lost)
	}
	if n, _ := m.ZMembers("t:r:{pool}:leases"); len(n) != 0 {
		t.Fatalf("leases left %v", n)
	}
}

func firstNot(t *testing.T, m *miniredis.Miniredis, key string, exclude ...string) string {
	t.Helper()
	members, err := m.ZMembers(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range members {
		held := false
		for _, ex := range exclude {
			if s, err := m.ZMembers(ex); err == nil && slices.Contains(s, id) {
				held = true
			}
		}
		if !held {
			return id
		}
	}
	t.Fatalf("no member of %s outside %v", key, exclude)
	return ""
}
