package llm

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// RetryPolicy decides how long to wait before retrying a provider call
// that failed before its first chunk (docs/TIMEOUTS.md). The queue worker
// and the direct path share it so that both honour the upstream alike.
// The zero value takes every default.
type RetryPolicy struct {
	// RetryAfterMax caps an upstream Retry-After, and the throttled backoff
	// below (LLM_RETRY_AFTER_MAX_SECONDS, default 30s). A longer
	// Retry-After is cut to it rather than making the client wait
	// unboundedly.
	RetryAfterMax time.Duration
	// ThrottleDelay is the first wait after a 429 or 503 without
	// Retry-After; it doubles at each attempt up to RetryAfterMax: 2, 4, 8,
	// 16, 30, 30 s by default. Default 2s; tests shorten it.
	ThrottleDelay time.Duration
	// BaseDelay is the first wait after any other retryable failure (a
	// refused connection, a 502, a timeout); it doubles at each attempt up
	// to MaxDelay, with ±50% jitter so that workers that failed together
	// do not retry together (QUEUE_FAILOVER_BASE_DELAY_MS, default 100ms).
	BaseDelay time.Duration
	// MaxDelay caps BaseDelay's backoff (QUEUE_FAILOVER_MAX_DELAY_MS,
	// default 5s).
	MaxDelay time.Duration
}

// Defaults of RetryPolicy's fields (docs/TIMEOUTS.md).
const (
	DefaultRetryAfterMax = 30 * time.Second
	DefaultThrottleDelay = 2 * time.Second
	DefaultBaseDelay     = 100 * time.Millisecond
	DefaultMaxDelay      = 5 * time.Second
)

// Validate reports the first invalid field of p.
func (p RetryPolicy) Validate() error {
	switch {
	case p.RetryAfterMax < 0:
		return fmt.Errorf("llm: retry: RetryAfterMax %s is negative", p.RetryAfterMax)
	case p.ThrottleDelay < 0:
		return fmt.Errorf("llm: retry: ThrottleDelay %s is negative", p.ThrottleDelay)
	case p.BaseDelay < 0:
		return fmt.Errorf("llm: retry: BaseDelay %s is negative", p.BaseDelay)
	case p.MaxDelay < 0:
		return fmt.Errorf("llm: retry: MaxDelay %s is negative", p.MaxDelay)
	}
	p = p.withDefaults()
	switch {
	case p.MaxDelay < p.BaseDelay:
		return fmt.Errorf("llm: retry: MaxDelay %s is shorter than BaseDelay %s", p.MaxDelay, p.BaseDelay)
	case p.RetryAfterMax < p.ThrottleDelay:
		return fmt.Errorf("llm: retry: RetryAfterMax %s is shorter than ThrottleDelay %s", p.RetryAfterMax, p.ThrottleDelay)
	}
	return nil
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.RetryAfterMax == 0 {
		p.RetryAfterMax = DefaultRetryAfterMax
	}
	if p.ThrottleDelay == 0 {
		p.ThrottleDelay = DefaultThrottleDelay
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	return p
}

// Delay returns how long to wait before retry number attempt (1 for the
// first retry) of a call that failed with err, and false when err is not
// worth retrying (IsRetryable is false: a client error, a cancellation, a
// permanent failure). It does not count attempts: the caller stops at its
// own limit (QUEUE_FAILOVER_MAX_RETRIES).
//
//   - An upstream Retry-After is honoured, capped at RetryAfterMax: the
//     upstream knows when it will have room, and retrying sooner only
//     earns another 429.
//   - A 429 or 503 without one waits ThrottleDelay, doubling per attempt up
//     to RetryAfterMax, without jitter: an overloaded upstream needs
//     seconds, not the sub-second backoff of a transient fault.
//   - Any other retryable failure backs off from BaseDelay to MaxDelay
//     with jitter.
func (p RetryPolicy) Delay(err error, attempt int) (time.Duration, bool) {
	if !IsRetryable(err) {
		return 0, false
	}
	if errors.Is(err, ErrNoCapacity) {
		// Nothing was sent and no upstream is at fault: no wait. The api
		// hands the request to the queue at once, as for a full pool; a
		// worker waits for capacity in the provider itself.
		return 0, true
	}
	p = p.withDefaults()
	attempt = max(attempt, 1)
	var e *Error
	if !errors.As(err, &e) {
		return min(nthBackOff(&backoff.ExponentialBackOff{InitialInterval: p.BaseDelay,
			RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: p.MaxDelay}, attempt), p.MaxDelay), true
	}
	switch {
	case e.RetryAfter > 0:
		return min(e.RetryAfter, p.RetryAfterMax), true
	case e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable:
		return nthBackOff(&backoff.ExponentialBackOff{InitialInterval: p.ThrottleDelay,
			Multiplier: 2, MaxInterval: p.RetryAfterMax}, attempt), true
	}
	// Jitter can push a delay past MaxInterval: cap it again.
	return min(nthBackOff(&backoff.ExponentialBackOff{InitialInterval: p.BaseDelay,
		RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: p.MaxDelay}, attempt), p.MaxDelay), true
}

// nthBackOff returns b's delay for attempt n (n ≥ 1). The policy is kept
// stateless, so callers need hold only the attempt number; the few calls
// are cheap, as attempts are bounded by the retry limit.
func nthBackOff(b *backoff.ExponentialBackOff, n int) time.Duration {
	b.Reset()
	var d time.Duration
	for range min(n, 64) { // past 64 doublings every interval is capped
		d = b.NextBackOff()
	}
	return d
}
