package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Defaults of zero Config fields. The first four are the BREAKER_*
// settings' defaults (docs/OPERATIONS.md).
const (
	DefaultFailures         = 5
	DefaultWindow           = time.Minute
	DefaultOpenTimeout      = 30 * time.Second
	DefaultHalfOpenRequests = 3
	DefaultFailureRatio     = 0.5
	DefaultMinRequests      = 20
)

// Config configures a provider's circuit breaker. A zero field takes its
// default.
type Config struct {
	// Name names the circuit in its log lines and is the provider label
	// of spillway_circuit_state. Default: the provider's Name(). With
	// several upstreams each circuit is named after its upstream.
	Name string
	// ConsecutiveFailures opens the circuit after this many provider
	// failures in a row (BREAKER_FAILURES). Default 5.
	ConsecutiveFailures uint32
	// FailureRatio opens the circuit when at least this share of the calls
	// finished within Window failed, once MinRequests finished. Default 0.5.
	FailureRatio float64
	// MinRequests is how many calls must finish within Window before
	// FailureRatio applies. Default 20.
	MinRequests uint32
	// Window is the rolling window, in six buckets, over which
	// FailureRatio and MinRequests are counted while closed
	// (BREAKER_WINDOW_SECONDS). Default 60s.
	Window time.Duration
	// OpenTimeout is how long the circuit stays open before it lets trial
	// calls through, half-open (BREAKER_OPEN_SECONDS). Default 30s.
	OpenTimeout time.Duration
	// HalfOpenMaxRequests is how many trial calls run while half-open;
	// that many successes close the circuit, one failure opens it again
	// (BREAKER_HALF_OPEN_REQUESTS). Default 3.
	HalfOpenMaxRequests uint32
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.ConsecutiveFailures == 0 {
		c.ConsecutiveFailures = DefaultFailures
	}
	if c.FailureRatio == 0 {
		c.FailureRatio = DefaultFailureRatio
	}
	if c.MinRequests == 0 {
		c.MinRequests = DefaultMinRequests
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.OpenTimeout == 0 {
		c.OpenTimeout = DefaultOpenTimeout
	}
	if c.HalfOpenMaxRequests == 0 {
		c.HalfOpenMaxRequests = DefaultHalfOpenRequests
	}
	return c
}

// Validate reports bad values without changing c; zero fields are valid
// (they take their defaults).
func (c Config) Validate() error {
	var errs []error
	if c.FailureRatio < 0 || c.FailureRatio > 1 || c.FailureRatio != c.FailureRatio {
		errs = append(errs, fmt.Errorf("breaker: FailureRatio %v must be in (0, 1]", c.FailureRatio))
	}
	if c.Window < 0 || c.OpenTimeout < 0 {
		errs = append(errs, errors.New("breaker: Window and OpenTimeout must not be negative"))
	}
	return errors.Join(errs...)
}

// Breaker is a circuit breaker around one provider
// (github.com/sony/gobreaker). It implements llm.Provider: Stream runs the
// call through the circuit. Only failures llm.CountsAgainstBreaker names
// count against the circuit (docs/TIMEOUTS.md): a call whose caller's
// context ended, whose emit callback failed (the client went away or is
// too slow), that the provider refused as a client error (400, 404, 413,
// 415, 422), that was throttled (429), or that timed out after its first
// chunk is counted neither way. OpenFor lets the api's admission gate
// refuse before queueing while the circuit is open. The open → half-open
// step happens on the first State, OpenFor or Stream after OpenTimeout.
// Breaker is safe for concurrent use.
type Breaker struct {
	cfg   Config
	p     llm.Provider
	cb    *gobreaker.CircuitBreaker[llm.Result]
	gauge prometheus.Gauge
	log   *slog.Logger
	now   func() time.Time // must agree with gobreaker's clock (time.Now; synctest in tests)

	state     atomic.Int32 // gobreaker.State, mirrored by OnStateChange
	openUntil atomic.Int64 // unix nanoseconds when the open circuit turns half-open
}

var _ llm.Provider = (*Breaker)(nil)

// New wraps p in a circuit named cfg.Name, else after p.Name(), which is
// also the provider label of spillway_circuit_state.
func New(cfg Config, p llm.Provider, m *metrics.Metrics, log *slog.Logger) (*Breaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if p == nil || m == nil || log == nil {
		return nil, errors.New("breaker: needs a provider, metrics and logger")
	}
	if cfg.Name == "" {
		cfg.Name = p.Name()
	}
	b := &Breaker{cfg: cfg, p: p, gauge: m.CircuitState.WithLabelValues(cfg.Name),
		log: log, now: time.Now}
	b.gauge.Set(float64(gobreaker.StateClosed))
	b.cb = gobreaker.NewCircuitBreaker[llm.Result](gobreaker.Settings{
		Name:         cfg.Name,
		MaxRequests:  cfg.HalfOpenMaxRequests,
		Interval:     cfg.Window,
		BucketPeriod: cfg.Window / 6,
		Timeout:      cfg.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			// Requests also counts calls still running and uncounted ones.
			done := c.TotalSuccesses + c.TotalFailures
			return c.ConsecutiveFailures >= cfg.ConsecutiveFailures ||
				(done >= cfg.MinRequests && float64(c.TotalFailures) >= cfg.FailureRatio*float64(done))
		},
		IsExcluded:    func(err error) bool { var u *uncounted; return errors.As(err, &u) },
		OnStateChange: b.onStateChange,
	})
	return b, nil
}

// onStateChange runs under gobreaker's lock: it must not call back into
// the circuit.
func (b *Breaker) onStateChange(name string, from, to gobreaker.State) {
	if to == gobreaker.StateOpen {
		b.openUntil.Store(b.now().Add(b.cfg.OpenTimeout).UnixNano())
	}
	b.state.Store(int32(to))
	b.gauge.Set(float64(to))
	if to == gobreaker.StateOpen {
		b.log.Warn("provider circuit opened: failing fast", "provider", name, "from", from.String(),
			"open_for", b.cfg.OpenTimeout)
		return
	}
	b.log.Info("provider circuit "+to.String(), "provider", name, "from", from.String())
}

// Name returns the wrapped provider's name.
func (b *Breaker) Name() string { return b.p.Name() }

// State returns the circuit's state; its int value is what
// spillway_circuit_state shows (0 closed, 1 half-open, 2 open).
func (b *Breaker) State() gobreaker.State { return b.cb.State() }

// OpenFor returns how long the circuit still refuses every call: 0 while
// it is closed or half-open, or once its open time is over (it then turns
// half-open here). It reads atomics only, except in that last case, so
// the admission gate asks it on every request.
func (b *Breaker) OpenFor() time.Duration {
	if gobreaker.State(b.state.Load()) != gobreaker.StateOpen {
		return 0
	}
	left := time.Duration(b.openUntil.Load() - b.now().UnixNano())
	if left <= 0 {
		if b.cb.State() != gobreaker.StateOpen {
			return 0
		}
		left = time.Second
	}
	return left
}

// uncounted carries an error the circuit must count neither as success
// nor as failure.
type uncounted struct{ err error }

func (u *uncounted) Error() string { return u.err.Error() }
func (u *uncounted) Unwrap() error { return u.err }

// Stream calls the provider through the circuit. While the circuit refuses
// calls it returns at once an *llm.Error (Retryable, RetryAfter = time
// left open) wrapping llm.ErrCircuitOpen (llm.IsCircuitOpen); otherwise
// what the provider returned.
func (b *Breaker) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	res, err := b.cb.Execute(func() (llm.Result, error) {
		res, err := b.p.Stream(ctx, req, emit)
		// Only failures that say the provider is unhealthy count
		// (llm.CountsAgainstBreaker, docs/TIMEOUTS.md): not the caller's
		// cancellation, emit's error, a client error, a 429, nor a timeout
		// after the first chunk. The caller's own deadline counts neither.
		if err != nil && (ctx.Err() != nil || !llm.CountsAgainstBreaker(err)) {
			return res, &uncounted{err}
		}
		return res, err
	})
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		left := max(time.Duration(b.openUntil.Load()-b.now().UnixNano()), time.Second)
		if errors.Is(err, gobreaker.ErrTooManyRequests) {
			left = time.Second // half-open: the trial call decides soon
		}
		return llm.Result{}, &llm.Error{Retryable: true, RetryAfter: left,
			Err: fmt.Errorf("breaker: provider %s: %w", b.cfg.Name, llm.ErrCircuitOpen)}
	}
	var u *uncounted
	if errors.As(err, &u) {
		err = u.err
	}
	return res, err
}
