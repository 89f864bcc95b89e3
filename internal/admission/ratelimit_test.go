package admission

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func TestLimitFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		rps   float64
		burst int
		want  redis_rate.Limit
	}{
		{0.5, 2, redis_rate.Limit{Rate: 1, Burst: 2, Period: 2 * time.Second}},
		{2.5, 3, redis_rate.Limit{Rate: 1, Burst: 3, Period: 400 * time.Millisecond}},
		{1.0 / 3, 1, redis_rate.Limit{Rate: 1, Burst: 1, Period: 3 * time.Second}},
		{10, 20, redis_rate.Limit{Rate: 10, Burst: 20, Period: time.Second}},
		{1, 0, redis_rate.Limit{Rate: 1, Burst: 1, Period: time.Second}}, // burst 0 would refuse everything
		{0.001, 1, redis_rate.Limit{Rate: 1, Burst: 1, Period: 1000 * time.Second}},
	}
	for _, tt := range tests {
		got := limitFor(tt.rps, tt.burst)
		if got != tt.want {
			t.Errorf("limitFor(%v, %d) = %+v, want %+v", tt.rps, tt.burst, got, tt.want)
		}
		// The emission interval is what GCRA uses: it must be 1/rps.
		emission := got.Period.Seconds() / float64(got.Rate)
		if math.Abs(emission-1/tt.rps) > 1e-9 {
			t.Errorf("limitFor(%v): emission interval %vs, want %vs", tt.rps, emission, 1/tt.rps)
		}
	}
}

// countingHook counts commands sent through a go-redis client.
type countingHook struct{ n atomic.Int64 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

func newTestLimiter(tb testing.TB, cfg RateLimitConfig, rdb redis.UniversalClient) (*RateLimiter, *metrics.Metrics, *testutil.LogBuffer) {
	tb.Helper()
	log, lb := testutil.NewLog(tb)
	m := newMetrics(tb)
	l, err := NewRateLimiter(cfg, rdb, m, log)
	if err != nil {
		tb.Fatalf("NewRateLimiter: %v", err)
	}
	return l, m, lb
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func checkRateLimited(tb testing.TB, p *protocol.Problem, wantRetry int) {
	tb.Helper()
	if p == nil {
		tb.Fatal("request accepted, want 429")
	}
	if p.Status != http.StatusTooManyRequests || p.Slug() != protocol.ProblemRateLimited {
		tb.Fatalf("problem %d %q, want 429 %q", p.Status, p.Slug(), protocol.ProblemRateLimited)
	}
	if p.RetryAfterSeconds != wantRetry {
		tb.Fatalf("retry_after = %d, want %d", p.RetryAfterSeconds, wantRetry)
	}
}

// TestRateLimiterRedis runs on a redis-server and on a 3-node Redis
// Cluster: redis_rate keeps one key per identity, so each identity's limit
// is one slot's business.
func TestRateLimiterRedis(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, b := range []struct {
		name string
		rdb  redis.UniversalClient
	}{{"single", s.Client(t)}, {"cluster", cluster.Client(t)}} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testRateLimiterRedis(t, b.rdb)
		})
	}
}

func testRateLimiterRedis(t *testing.T, rdb redis.UniversalClient) {
	tests := []struct {
		rps       float64
		burst     int
		wantRetry int // ceil(1/rps): the next request is one emission interval away
	}{
		{0.5, 2, 2},
		{0.2, 1, 5},
		{1, 3, 1},
		{10, 5, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("rps=%v,burst=%d", tt.rps, tt.burst), func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			l, m, _ := newTestLimiter(t, RateLimitConfig{RPS: tt.rps, Burst: tt.burst, KeyPrefix: prefix}, rdb)
			ctx := t.Context()
			for i := range tt.burst {
				if p := l.Allow(ctx, "alice"); p != nil {
					t.Fatalf("request %d of a burst of %d refused: %v", i+1, tt.burst, p)
				}
			}
			checkRateLimited(t, l.Allow(ctx, "alice"), tt.wantRetry)
			for i := range tt.burst {
				if p := l.Allow(ctx, "bob"); p != nil {
					t.Fatalf("bob's request %d refused after alice was limited: %v", i+1, p)
				}
			}
			checkRateLimited(t, l.Allow(ctx, "bob"), tt.wantRetry)
			if got := promtest.ToFloat64(m.RateLimited); got != 2 {
				t.Fatalf("spillway_rate_limited_total = %v, want 2", got)
			}
			for _, who := range []string{"alice", "bob"} { // one EXISTS each: on a Cluster they are on different slots
				if n, err := rdb.Exists(ctx, "rate:"+prefix+who).Result(); err != nil || n != 1 {
					t.Fatalf("redis key for %s: %d, %v; want it (the limit must live in redis)", who, n, err)
				}
			}
			if l.Degraded() {
				t.Fatal("Degraded() with redis up")
			}
		})
	}
}

func TestRateLimiterOff(t *testing.T) {
	t.Parallel()
	hook := &countingHook{}
	rdb := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(hook)

	off, m, _ := newTestLimiter(t, RateLimitConfig{RPS: 0, Burst: 1}, rdb)
	if off.Enabled() {
		t.Fatal("Enabled() with RPS 0")
	}
	for i := range 1000 {
		if p := off.Allow(t.Context(), "alice"); p != nil {
			t.Fatalf("request %d refused with the limiter off: %v", i, p)
		}
	}
	if n := hook.n.Load(); n != 0 {
		t.Fatalf("limiter off sent %d redis commands, want 0", n)
	}
	if got := promtest.ToFloat64(m.RateLimited); got != 0 {
		t.Fatalf("spillway_rate_limited_total = %v, want 0", got)
	}
	// The hook does see the limiter when it is on (so 0 above means something).
	on, _, _ := newTestLimiter(t, RateLimitConfig{RPS: 1, Burst: 1}, rdb)
	_ = on.Allow(t.Context(), "alice")
	if hook.n.Load() == 0 {
		t.Fatal("the counting hook saw no command from a limiter that is on")
	}
	// No client is needed when off.
	if _, err := NewRateLimiter(RateLimitConfig{}, nil, newMetrics(t), testutil.DiscardLogger()); err != nil {
		t.Fatalf("NewRateLimiter off without a client: %v", err)
	}
	if _, err := NewRateLimiter(RateLimitConfig{RPS: 1}, nil, newMetrics(t), testutil.DiscardLogger()); err == nil {
		t.Fatal("NewRateLimiter on without a client succeeded")
	}
}

func TestRateLimiterFallback(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	hook := &countingHook{}
	rdb.AddHook(hook)
	prefix := redistest.Prefix(t)
	l, m, lb := newTestLimiter(t, RateLimitConfig{RPS: 0.5, Burst: 2, KeyPrefix: prefix}, rdb)
	clock := newFakeClock()
	l.now = clock.Now
	ctx := t.Context()

	if p := l.Allow(ctx, "alice"); p != nil {
		t.Fatalf("first request with redis up refused: %v", p)
	}
	s.Stop()

	// Redis is gone: the limiter still limits, locally, and says so once.
	for i := range 2 {
		if p := l.Allow(ctx, "carol"); p != nil {
			t.Fatalf("carol's request %d refused within her burst while redis is down: %v", i+1, p)
		}
	}
	if !l.Degraded() {
		t.Fatal("Degraded() = false with redis stopped")
	}
	checkRateLimited(t, l.Allow(ctx, "carol"), 2)
	sent := hook.n.Load()
	for range 100 {
		_ = l.Allow(ctx, "dave")
	}
	if got := hook.n.Load(); got != sent {
		t.Fatalf("%d redis commands while degraded within one probe period, want 0", got-sent)
	}
	if got := promtest.ToFloat64(m.RateLimited); got != 99 { // carol once, dave 98 times
		t.Fatalf("spillway_rate_limited_total = %v, want 99", got)
	}
	if n := lb.Count("redis unreachable"); n != 1 {
		t.Fatalf("%d 'redis unreachable' lines, want 1:\n%s", n, lb)
	}
	// Local GCRA honours time: one emission interval later carol may go again.
	clock.Advance(2 * time.Second)
	if p := l.Allow(ctx, "carol"); p != nil {
		t.Fatalf("carol refused locally one emission interval later: %v", p)
	}
	checkRateLimited(t, l.Allow(ctx, "carol"), 2)
	if n := lb.Count("redis unreachable"); n != 1 {
		t.Fatalf("a failed probe logged again: %d 'redis unreachable' lines, want 1", n)
	}

	// Redis is back: within a probe period the limiter uses it again.
	s.Restart(t)
	testutil.Eventually(t, 5*time.Second, func() bool {
		clock.Advance(time.Second)
		_ = l.Allow(ctx, "erin")
		return !l.Degraded()
	}, "limiter back on redis after restart")
	if n := lb.Count("redis answers again"); n != 1 {
		t.Fatalf("%d recovery lines, want 1:\n%s", n, lb)
	}
	if got := l.local.size(); got != 0 {
		t.Fatalf("local fallback still remembers %d identities after recovery", got)
	}
	if p := l.Allow(ctx, "frank"); p != nil {
		t.Fatalf("frank refused on redis: %v", p)
	}
	if n, err := rdb.Exists(ctx, "rate:"+prefix+"frank").Result(); err != nil || n != 1 {
		t.Fatalf("frank's key in redis: %d, %v; want it there after recovery", n, err)
	}
}

func TestLocalGCRA(t *testing.T) {
	t.Parallel()
	g := newLocalGCRA(limitFor(0.5, 2), 3)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		id    string
		at    time.Duration
		ok    bool
		retry time.Duration
	}{
		{"a", 0, true, 0},
		{"a", 0, true, 0},
		{"a", 0, false, 2 * time.Second},
		{"a", 500 * time.Millisecond, false, 1500 * time.Millisecond},
		{"a", 2 * time.Second, true, 0},
		{"a", 2 * time.Second, false, 2 * time.Second},
		{"b", 2 * time.Second, true, 0}, // independent
		{"a", 10 * time.Second, true, 0},
		{"a", 10 * time.Second, true, 0}, // a full burst again after idling
		{"a", 10 * time.Second, false, 2 * time.Second},
	}
	for i, s := range steps {
		ok, retry := g.allow(s.id, t0.Add(s.at))
		if ok != s.ok || retry != s.retry {
			t.Fatalf("step %d (%s at %v): allow = %v, %v; want %v, %v", i, s.id, s.at, ok, retry, s.ok, s.retry)
		}
	}
}

func TestLocalGCRABounded(t *testing.T) {
	t.Parallel()
	g := newLocalGCRA(limitFor(1, 1), 100)
	now := time.Now()
	for i := range 1000 {
		g.allow(fmt.Sprint("id-", i), now)
	}
	if got := g.size(); got != 100 {
		t.Fatalf("remembers %d identities, want the bound 100", got)
	}
	// The most recently seen identities are kept: id-999 is still limited.
	if ok, _ := g.allow("id-999", now); ok {
		t.Fatal("id-999 allowed twice with burst 1: its entry was evicted instead of the oldest")
	}
	// The oldest was evicted: it starts over with a full burst.
	if ok, _ := g.allow("id-0", now); !ok {
		t.Fatal("id-0 still limited: the least recently seen entry was not evicted")
	}
}

func TestRateLimitConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg   RateLimitConfig
		valid bool
	}{
		{RateLimitConfig{}, true},
		{RateLimitConfig{RPS: 2.5, Burst: 3}, true},
		{RateLimitConfig{RPS: -1}, false},
		{RateLimitConfig{RPS: math.NaN()}, false},
		{RateLimitConfig{RPS: math.Inf(1)}, false},
		{RateLimitConfig{RPS: 1, Burst: -1}, false},
		{RateLimitConfig{RPS: 1, Timeout: -time.Second}, false},
	}
	for _, tt := range tests {
		if err := tt.cfg.Validate(); (err == nil) != tt.valid {
			t.Errorf("Validate(%+v) = %v, want valid %v", tt.cfg, err, tt.valid)
		}
	}
}
