package admission

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// RateLimitConfig configures the per-identity rate limiter.
type RateLimitConfig struct {
	// RPS is the sustained rate per identity in requests per second
	// (RATE_LIMIT_RPS, default 0 = off). Fractional rates stay exact:
	// 0.5 allows one request every 2s.
	RPS float64
	// Burst is how many requests an identity may send at once
	// (RATE_LIMIT_BURST, default 0); below 1 counts as 1, since GCRA with
	// no burst would refuse everything.
	Burst int
	// KeyPrefix namespaces the Redis keys: an identity's key is
	// "rate:" + KeyPrefix + identity (redis_rate adds "rate:"). Default "".
	KeyPrefix string
	// Timeout bounds one Redis call; an error or a slower answer switches
	// to the local fallback. Default 200ms.
	Timeout time.Duration
	// ProbeEvery is how often, at most, Redis is tried again while the
	// limiter limits locally. Default 1s.
	ProbeEvery time.Duration
	// LocalMaxKeys bounds how many identities the local fallback remembers.
	// Default 10000.
	LocalMaxKeys int
}

// Defaults of zero RateLimitConfig fields.
const (
	DefaultRateLimitTimeout      = 200 * time.Millisecond
	DefaultRateLimitProbeEvery   = time.Second
	DefaultRateLimitLocalMaxKeys = 10000
)

func (c RateLimitConfig) withDefaults() RateLimitConfig {
	if c.Timeout == 0 {
		c.Timeout = DefaultRateLimitTimeout
	}
	if c.ProbeEvery == 0 {
		c.ProbeEvery = DefaultRateLimitProbeEvery
	}
	if c.LocalMaxKeys == 0 {
		c.LocalMaxKeys = DefaultRateLimitLocalMaxKeys
	}
	return c
}

// Validate reports bad values without changing c. Zero durations and
// LocalMaxKeys are valid: they take their defaults.
// RPS and Burst out of range are *bounds.Errors.
func (c RateLimitConfig) Validate() error {
	errs := []error{bounds.AtLeast("Burst", c.Burst, 0)}
	if math.IsNaN(c.RPS) || math.IsInf(c.RPS, 0) || c.RPS < 0 {
		errs = append(errs, &bounds.Error{Field: "RPS", Value: c.RPS, Rule: "must be 0 (off) or a positive number"})
	} else {
		errs = append(errs, bounds.AtMost("RPS", c.RPS, maxRPS))
	}
	if c.Timeout < 0 || c.ProbeEvery < 0 || c.LocalMaxKeys < 0 {
		errs = append(errs, errors.New("Timeout, ProbeEvery and LocalMaxKeys must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("admission: rate limit: %w", err)
	}
	return nil
}

// maxRPS is the highest RateLimitConfig.RPS: a faster rate is no limit.
const maxRPS = 1e6

// limitFor maps a rate and burst to a redis_rate limit with the same
// emission interval (Period/Rate): whole rates per second, anything else
// as one request per exactly 1s/rps.
func limitFor(rps float64, burst int) redis_rate.Limit {
	burst = max(burst, 1)
	if rps == math.Trunc(rps) {
		return redis_rate.Limit{Rate: int(rps), Burst: burst, Period: time.Second}
	}
	return redis_rate.Limit{Rate: 1, Burst: burst, Period: time.Duration(math.Round(float64(time.Second) / rps))}
}

// RateLimiter limits each identity with GCRA on Redis
// (github.com/go-redis/redis_rate), shared by every api process. When
// Redis errs or does not answer within Timeout it limits locally with the
// same GCRA per process — N api processes then admit up to N times the
// rate — and tries Redis again at most every ProbeEvery; each switch is
// logged once. It is safe for concurrent use.
type RateLimiter struct {
	cfg     RateLimitConfig
	limit   redis_rate.Limit
	rl      *redis_rate.Limiter // nil when off
	local   *localGCRA
	limited prometheus.Counter
	log     *slog.Logger
	now     func() time.Time

	degraded  atomic.Bool  // limiting locally
	nextProbe atomic.Int64 // unix nanoseconds; while degraded, Redis is tried once this has passed
}

// NewRateLimiter returns the limiter. rdb may be nil when cfg.RPS is 0
// (the limiter is then off); it is never closed by the limiter.
func NewRateLimiter(cfg RateLimitConfig, rdb redis.UniversalClient, m *metrics.Metrics, log *slog.Logger) (*RateLimiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if m == nil || log == nil {
		return nil, errors.New("admission: rate limiter needs metrics and a logger")
	}
	l := &RateLimiter{cfg: cfg, limited: m.RateLimited, log: log, now: time.Now}
	if cfg.RPS == 0 {
		return l, nil
	}
	if rdb == nil {
		return nil, errors.New("admission: rate limiter needs a redis client when RPS is set")
	}
	l.limit = limitFor(cfg.RPS, cfg.Burst)
	l.rl = redis_rate.NewLimiter(rdb)
	l.local = newLocalGCRA(l.limit, cfg.LocalMaxKeys)
	return l, nil
}

// Enabled reports whether the limiter limits at all (RPS above 0).
func (l *RateLimiter) Enabled() bool { return l.rl != nil }

// Degraded reports whether the limiter currently limits locally because
// Redis did not answer.
func (l *RateLimiter) Degraded() bool { return l.degraded.Load() }

// Allow spends one request of who's allowance: its identity.Bucket's, so
// a key's users share their key's. It returns nil to
// accept, or a 429 rate-limited problem whose Retry-After is when the next
// request would be accepted (whole seconds, at least 1); each refusal
// counts in spillway_rate_limited_total. With the limiter off it returns
// nil without touching Redis. It waits for Redis at most Timeout.
func (l *RateLimiter) Allow(ctx context.Context, who string) *protocol.Problem {
	if l.rl == nil {
		return nil
	}
	bucket := identity.Bucket(who)
	if l.degraded.Load() {
		next := l.nextProbe.Load()
		now := l.now()
		// One caller per ProbeEvery wins the swap and probes Redis.
		if now.UnixNano() < next || !l.nextProbe.CompareAndSwap(next, now.Add(l.cfg.ProbeEvery).UnixNano()) {
			return l.allowLocal(bucket, now)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	res, err := l.rl.Allow(rctx, l.cfg.KeyPrefix+bucket, l.limit)
	cancel()
	if err != nil {
		now := l.now()
		if ctx.Err() != nil {
			// The caller left; that says nothing about Redis.
			return l.allowLocal(bucket, now)
		}
		l.nextProbe.Store(now.Add(l.cfg.ProbeEvery).UnixNano())
		if l.degraded.CompareAndSwap(false, true) {
			l.log.Warn("rate limiter: redis unreachable, limiting locally per process", "err", err)
		}
		return l.allowLocal(bucket, now)
	}
	if l.degraded.CompareAndSwap(true, false) {
		l.log.Info("rate limiter: redis answers again, limiting on redis")
		l.local.reset()
	}
	if res.Allowed > 0 {
		return nil
	}
	return l.refuse(res.RetryAfter)
}

func (l *RateLimiter) allowLocal(identity string, now time.Time) *protocol.Problem {
	ok, retry := l.local.allow(identity, now)
	if ok {
		return nil
	}
	return l.refuse(retry)
}

func (l *RateLimiter) refuse(retry time.Duration) *protocol.Problem {
	l.limited.Inc()
	return protocol.RateLimited(protocol.RetryAfterSeconds(retry))
}

// localGCRA is the fallback: the GCRA redis_rate runs in Lua, kept per
// identity in process memory. It remembers at most maxKeys identities and
// evicts the least recently seen one; an evicted identity starts again with
// a full burst, the price of bounded memory. Entries whose theoretical
// arrival time has passed are equal to absent ones, so in practice the
// evicted entry is almost always one that carried no debt.
type localGCRA struct {
	emission    int64 // nanoseconds per request
	burstOffset int64 // emission × burst
	maxKeys     int

	mu   sync.Mutex
	keys map[string]*list.Element
	lru  list.List // of *gcraEntry, most recently seen first
}

type gcraEntry struct {
	id  string
	tat int64 // theoretical arrival time, unix nanoseconds
}

func newLocalGCRA(l redis_rate.Limit, maxKeys int) *localGCRA {
	e := int64(l.Period) / int64(l.Rate)
	return &localGCRA{emission: e, burstOffset: e * int64(l.Burst), maxKeys: maxKeys,
		keys: make(map[string]*list.Element)}
}

// allow reports whether one request of id may pass at now and, if not,
// how long until it would.
func (g *localGCRA) allow(id string, now time.Time) (bool, time.Duration) {
	t := now.UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	el, ok := g.keys[id]
	var e *gcraEntry
	if ok {
		e = el.Value.(*gcraEntry)
		g.lru.MoveToFront(el)
	} else {
		if g.lru.Len() >= g.maxKeys {
			old := g.lru.Back()
			delete(g.keys, old.Value.(*gcraEntry).id)
			g.lru.Remove(old)
		}
		e = &gcraEntry{id: id, tat: t}
		g.keys[id] = g.lru.PushFront(e)
	}
	newTAT := max(e.tat, t) + g.emission
	if allowAt := newTAT - g.burstOffset; t < allowAt {
		return false, time.Duration(allowAt - t)
	}
	e.tat = newTAT
	return true, 0
}

// reset forgets every identity: Redis is authoritative again.
func (g *localGCRA) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.keys)
	g.lru.Init()
}

// size returns how many identities are remembered.
