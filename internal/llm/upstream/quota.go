package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/spillway-dev/spillway/internal/rediserr"
)

// Quota spends upstreams' per-minute request and token quotas (rpm, tpm
// of the Spec list the implementation was built with). Only upstreams with
// RPM or TPM above 0 are asked. Implementations are safe for concurrent
// use.
//
// Reserve spends one request and tokens of upstream i, or spends nothing
// and says how long until they would fit (ok false). Charge spends tokens
// an answer used beyond its reservation; unused reservations are not
// refunded (GCRA cannot give back time already passed), so the quota errs
// on the safe side.
type Quota interface {
	Reserve(ctx context.Context, i int, tokens int) (ok bool, retryAfter time.Duration, err error)
	Charge(ctx context.Context, i int, tokens int)
}

// EstimateTokens is a call's token reservation: prompt bytes / 4 (about a
// token per four bytes of English) plus the answer's max_tokens.
func EstimateTokens(promptBytes, maxTokens int) int {
	return promptBytes/4 + max(maxTokens, 0)
}

// LocalQuota is an in-process Quota on golang.org/x/time/rate: a token
// bucket per upstream and kind that refills its per-minute amount evenly
// and holds at most a minute's worth. It serves embedded mode and is
// RedisQuota's fallback, where N processes may then spend N quotas.
type LocalQuota struct {
	rpm, tpm []*rate.Limiter // nil entries mean no quota
}

var _ Quota = (*LocalQuota)(nil)

// NewLocalQuota returns quotas for specs.
func NewLocalQuota(specs []Spec) *LocalQuota {
	q := &LocalQuota{rpm: make([]*rate.Limiter, len(specs)), tpm: make([]*rate.Limiter, len(specs))}
	for i, s := range specs {
		if s.RPM > 0 {
			q.rpm[i] = rate.NewLimiter(rate.Limit(float64(s.RPM)/60), s.RPM)
		}
		if s.TPM > 0 {
			q.tpm[i] = rate.NewLimiter(rate.Limit(float64(s.TPM)/60), s.TPM)
		}
	}
	return q
}

// Reserve spends one request and tokens (capped at a minute's quota) of
// upstream i when both fit now.
func (q *LocalQuota) Reserve(_ context.Context, i int, tokens int) (bool, time.Duration, error) {
	now := time.Now()
	var rr, tr *rate.Reservation
	if l := q.rpm[i]; l != nil {
		rr = l.ReserveN(now, 1)
	}
	if l := q.tpm[i]; l != nil {
		tr = l.ReserveN(now, min(max(tokens, 1), l.Burst()))
	}
	wait := time.Duration(0)
	for _, r := range []*rate.Reservation{rr, tr} {
		if r != nil {
			wait = max(wait, r.DelayFrom(now))
		}
	}
	if wait > 0 {
		// Give both back: the call goes elsewhere and spends nothing here.
		for _, r := range []*rate.Reservation{rr, tr} {
			if r != nil {
				r.CancelAt(now)
			}
		}
		return false, wait, nil
	}
	return true, 0, nil
}

// Charge spends extra tokens of upstream i, even into debt.
func (q *LocalQuota) Charge(_ context.Context, i int, tokens int) {
	if l := q.tpm[i]; l != nil && tokens > 0 {
		l.ReserveN(time.Now(), min(tokens, l.Burst()))
	}
}

// RedisQuota is a cluster-wide Quota: GCRA on Redis with
// github.com/go-redis/redis_rate, one key per upstream and kind, a minute's
// quota as the burst. When Redis errs or is slow it spends LocalQuota
// instead and tries Redis again at most once a second, logging each switch.
type RedisQuota struct {
	rl     *redis_rate.Limiter
	specs  []Spec
	prefix string
	local  *LocalQuota
	log    *slog.Logger

	degraded  atomic.Bool
	nextProbe atomic.Int64
}

var _ Quota = (*RedisQuota)(nil)

// NewRedisQuota returns quotas for specs on rdb (never closed by it).
// prefix "" means DefaultPrefix.
func NewRedisQuota(rdb redis.UniversalClient, specs []Spec, prefix string, log *slog.Logger) (*RedisQuota, error) {
	if rdb == nil || log == nil {
		return nil, errors.New("upstream: redis quota needs a client and a logger")
	}
	if err := (RedisConfig{Prefix: prefix}).Validate(); err != nil {
		return nil, err
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &RedisQuota{rl: redis_rate.NewLimiter(rdb), specs: specs, prefix: prefix, local: NewLocalQuota(specs), log: log}, nil
}

func perMinute(n int) redis_rate.Limit {
	return redis_rate.Limit{Rate: n, Burst: n, Period: time.Minute}
}

// Reserve spends one request, then tokens, of upstream i on Redis. When
// the request fits and the tokens do not, the request stays spent: a
// small over-count, never an over-spend.
func (q *RedisQuota) Reserve(ctx context.Context, i int, tokens int) (bool, time.Duration, error) {
	if q.useLocal() {
		return q.local.Reserve(ctx, i, tokens)
	}
	s := q.specs[i]
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	defer cancel()
	if s.RPM > 0 {
		res, err := q.rl.Allow(cctx, quotaKey(q.prefix, s.Name, "rpm"), perMinute(s.RPM))
		if err != nil {
			return q.fallback(ctx, i, tokens, err)
		}
		if res.Allowed == 0 {
			return false, res.RetryAfter, nil
		}
	}
	if s.TPM > 0 {
		res, err := q.rl.AllowN(cctx, quotaKey(q.prefix, s.Name, "tpm"), perMinute(s.TPM), min(max(tokens, 1), s.TPM))
		if err != nil {
			return q.fallback(ctx, i, tokens, err)
		}
		if res.Allowed == 0 {
			return false, res.RetryAfter, nil
		}
	}
	q.setDegraded(false, nil)
	return true, 0, nil
}

// Charge spends extra tokens of upstream i; a failure only logs.
func (q *RedisQuota) Charge(ctx context.Context, i int, tokens int) {
	s := q.specs[i]
	if s.TPM == 0 || tokens <= 0 {
		return
	}
	if q.useLocal() {
		q.local.Charge(ctx, i, tokens)
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisCallTimeout)
	defer cancel()
	// AllowAtMost spends what fits now; the rest of an overrun is
	// forgiven rather than blocking the upstream for longer than a minute.
	if _, err := q.rl.AllowAtMost(cctx, quotaKey(q.prefix, s.Name, "tpm"), perMinute(s.TPM), min(tokens, s.TPM)); err != nil {
		q.log.Warn("upstream: charging tokens failed", "upstream", s.Name, "error", err)
	}
}

func (q *RedisQuota) useLocal() bool {
	if !q.degraded.Load() {
		return false
	}
	next := q.nextProbe.Load()
	now := time.Now().UnixNano()
	return now < next || !q.nextProbe.CompareAndSwap(next, now+int64(fallbackProbe))
}

func (q *RedisQuota) fallback(ctx context.Context, i, tokens int, err error) (bool, time.Duration, error) {
	if ctx.Err() != nil {
		return false, 0, fmt.Errorf("upstream: quota of %s: %w", q.specs[i].Name, ctx.Err())
	}
	if rediserr.Classify(err) == rediserr.Busy {
		// Slow, not gone: spend from the local quota for this call only.
		return q.local.Reserve(ctx, i, tokens)
	}
	q.setDegraded(true, err)
	return q.local.Reserve(ctx, i, tokens)
}

func (q *RedisQuota) setDegraded(on bool, err error) {
	if q.degraded.Swap(on) == on {
		return
	}
	if on {
		q.nextProbe.Store(time.Now().Add(fallbackProbe).UnixNano())
		q.log.Warn("upstream: Redis gone; upstream quotas are spent per process until it returns", "error", err)
	} else {
		q.log.Info("upstream: Redis is back; upstream quotas are cluster-wide again")
	}
}
