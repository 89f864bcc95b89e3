package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// testClaimsContract checks one Claims implementation against the rules
// the Consumer relies on. memClaims runs it too, so the test double used
// by the Kafka tests behaves like production.
func testClaimsContract(t *testing.T, c Claims) {
	ctx := ctxT(t, 20*time.Second)
	const ttl = 200 * time.Millisecond
	claim := func(id, member string) (int, error) {
		t.Helper()
		return c.Claim(ctx, id, member, ttl)
	}

	// A new job: attempt 1; the holder claiming again keeps it.
	if n, err := claim("j1", "a"); err != nil || n != 1 {
		t.Fatalf("first Claim = %d, %v; want 1, nil", n, err)
	}
	if n, err := claim("j1", "a"); err != nil || n != 1 {
		t.Fatalf("Claim by the holder = %d, %v; want 1, nil", n, err)
	}
	// Another member is refused while the claim lives.
	if _, err := claim("j1", "b"); !errors.Is(err, ErrClaimHeld) {
		t.Fatalf("Claim by another member = %v, want ErrClaimHeld", err)
	}
	// Refresh keeps it alive past the original ttl.
	start := time.Now()
	for time.Since(start) < 2*ttl {
		if err := c.Refresh(ctx, "j1", "a", ttl); err != nil {
			t.Fatalf("Refresh by the holder: %v", err)
		}
		if _, err := claim("j1", "b"); !errors.Is(err, ErrClaimHeld) {
			t.Fatalf("Claim of a refreshed job by another member = %v, want ErrClaimHeld", err)
		}
		letRealTimePass(t, ttl/4)
	}
	if err := c.Refresh(ctx, "j1", "b", ttl); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("Refresh by a non-holder = %v, want ErrClaimLost", err)
	}
	// Once a stops refreshing, b takes over with attempt 2, and a has lost it.
	var taken int
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, err := claim("j1", "b")
		taken = n
		return err == nil
	}, "takeover after the claim expired")
	if taken != 2 {
		t.Fatalf("takeover attempt = %d, want 2", taken)
	}
	if err := c.Refresh(ctx, "j1", "a", ttl); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("Refresh by the former holder = %v, want ErrClaimLost", err)
	}
	// A claim that expired but was not taken over is still the holder's.
	letRealTimePass(t, 2*ttl)
	if err := c.Refresh(ctx, "j1", "b", ttl); err != nil {
		t.Fatalf("Refresh of an expired, untaken claim by its holder: %v", err)
	}
	// Only the holder may release: a former holder (its claim taken over)
	// is refused and changes nothing.
	if err := c.Release(ctx, "j1", "a"); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("Release by the former holder = %v, want ErrClaimLost", err)
	}
	if err := c.Refresh(ctx, "j1", "b", ttl); err != nil {
		t.Fatalf("Refresh by the holder after a refused Release: %v", err)
	}
	// Released by the holder: done for every member, lost for the holder.
	if err := c.Release(ctx, "j1", "b"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Done stays done: the holder's retry after a lost reply, and a late
	// former holder, both find it done.
	for _, m := range []string{"b", "a"} {
		if err := c.Release(ctx, "j1", m); err != nil {
			t.Fatalf("Release by %s of a done job: %v", m, err)
		}
	}
	for _, m := range []string{"a", "b", "c"} {
		if _, err := claim("j1", m); !errors.Is(err, ErrClaimDone) {
			t.Fatalf("Claim by %s after Release = %v, want ErrClaimDone", m, err)
		}
	}
	if err := c.Refresh(ctx, "j1", "b", ttl); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("Refresh after Release = %v, want ErrClaimLost", err)
	}
	// Releasing a job nobody claimed records it done too; ids are separate.
	if err := c.Release(ctx, "j2", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := claim("j2", "a"); !errors.Is(err, ErrClaimDone) {
		t.Fatalf("Claim after a Release without claim = %v, want ErrClaimDone", err)
	}
	if n, err := claim("j3", "a"); err != nil || n != 1 {
		t.Fatalf("Claim of another id = %d, %v; want 1, nil", n, err)
	}
}

// letRealTimePass lets d of real time pass, the behaviour under test being
// what time does to a claim: expiry is measured by the store's clock
// (Redis TIME), which a test cannot advance.
func letRealTimePass(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-t.Context().Done():
		t.Fatal("test ended while waiting")
	}
}

func TestMemClaims(t *testing.T) {
	t.Parallel()
	testClaimsContract(t, newMemClaims())
}

func newRedisClaims(tb testing.TB, rdb redis.UniversalClient, prefix string) *RedisClaims {
	tb.Helper()
	c, err := NewRedisClaims(RedisClaimsConfig{Prefix: prefix}, rdb)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func TestRedisClaims(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	prefix := redistest.Prefix(t)
	c := newRedisClaims(t, rdb, prefix)
	testClaimsContract(t, c)

	// Key layout: one hash per id under prefix+"claim:", kept for the
	// retention.
	ctx := ctxT(t, 5*time.Second)
	if _, err := c.Claim(ctx, "layout", "m", time.Minute); err != nil {
		t.Fatal(err)
	}
	key := ClaimKey(prefix, "layout")
	if key != prefix+"claim:layout" {
		t.Fatalf("ClaimKey = %q", key)
	}
	h, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if h["member"] != "m" || h["attempt"] != "1" || h["expires_ms"] == "" {
		t.Fatalf("claim hash = %v", h)
	}
	if ttl, err := rdb.PTTL(ctx, key).Result(); err != nil || ttl < DefaultClaimRetention-time.Minute || ttl > DefaultClaimRetention {
		t.Fatalf("claim key TTL = %s, %v; want about %s", ttl, err, DefaultClaimRetention)
	}
}

// TestRedisClaimsCluster: each claim is one hash whose scripts touch only
// it, so the contract holds on a Redis Cluster, with claims on every node.
func TestRedisClaimsCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	testClaimsContract(t, newRedisClaims(t, cluster.Client(t), redistest.Prefix(t)))
}

func TestRedisClaimsMiniredis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	testClaimsContract(t, newRedisClaims(t, rdb, "q:"))
}

func TestRedisClaimsConfig(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	if _, err := NewRedisClaims(RedisClaimsConfig{}, nil); err == nil {
		t.Error("nil client accepted")
	}
	for _, r := range []time.Duration{-time.Minute, time.Second} {
		if _, err := NewRedisClaims(RedisClaimsConfig{Retention: r}, rdb); err == nil {
			t.Errorf("Retention %s accepted", r)
		}
	}
	if _, err := NewRedisClaims(RedisClaimsConfig{}, rdb); err != nil {
		t.Errorf("zero config: %v", err)
	}
	// Redis unreachable: errors, not a hang, and not a false verdict.
	c := newRedisClaims(t, rdb, "q:")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.Claim(ctx, "x", "m", time.Second); err == nil || errors.Is(err, ErrClaimHeld) || errors.Is(err, ErrClaimDone) {
		t.Errorf("Claim with Redis down = %v, want a plain error", err)
	}
	if err := c.Refresh(ctx, "x", "m", time.Second); err == nil || errors.Is(err, failover.ErrClaimLost) {
		t.Errorf("Refresh with Redis down = %v, want an error that is not ErrClaimLost", err)
	}
}
