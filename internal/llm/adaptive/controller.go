package adaptive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/llm"
)

// reportTimeout bounds one report to the store.
const reportTimeout = time.Second

// Config configures a Controller.
type Config struct {
	// Name names the limit in the store: the pool's is "global"; a limit
	// per upstream would use the upstream's name. Required.
	Name string
	// Params bound and pace the limit.
	Params Params
	// FirstTokenTarget, when above 0, counts an interval whose first-token
	// p99 (of this process's calls) is above it as a throttle
	// (ADAPTIVE_FIRST_TOKEN_TARGET_MS).
	FirstTokenTarget time.Duration
}

// Validate reports bad values.
func (c Config) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("adaptive: a limit needs a name"))
	}
	if err := c.Params.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := bounds.AtLeast("FirstTokenTarget", c.FirstTokenTarget, 0); err != nil {
		errs = append(errs, fmt.Errorf("adaptive: %w", err))
	}
	return errors.Join(errs...)
}

// Controller runs one named limit for this process: Observe counts the
// calls it sees, and Run reports them to the store every interval, and at
// once when the provider throttles, so that a 429 halves the limit
// without waiting for the interval to end.
//
// Observe and Limit are safe for concurrent use and never block; Run must
// run once, in a goroutine its owner waits for.
type Controller struct {
	cfg     Config
	store   Store
	log     *slog.Logger
	onLimit func(int)

	limit atomic.Int64
	kick  chan struct{} // cap 1: a throttle to report now

	mu        sync.Mutex
	calls     int64 // calls ended since the last report
	throttled bool  // a 429/503 not reported yet
	firsts    int64 // calls with a first chunk this interval
	slow      int64 // of them, slower than the target
}

// New returns a controller for cfg's limit in store. onLimit, if not nil,
// is called with the limit after every report (from Run's goroutine; it
// must not block): a local pool takes its limit from it. log may be nil
// (slog.Default).
func New(cfg Config, store Store, log *slog.Logger, onLimit func(int)) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, errors.New("adaptive: a controller needs a store")
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Controller{cfg: cfg, store: store, log: log, onLimit: onLimit, kick: make(chan struct{}, 1)}
	c.limit.Store(int64(cfg.Params.Ceiling))
	return c, nil
}

// Limit returns the limit as last reported by the store (the ceiling
// before the first report).
func (c *Controller) Limit() int { return int(c.limit.Load()) }

// Observe counts one finished provider call: an upstream 429 or 503 is
// reported at once, the others with the interval.
func (c *Controller) Observe(call llm.Call) {
	throttled := call.Throttled()
	c.mu.Lock()
	c.calls++
	if throttled {
		c.throttled = true
	}
	if call.Chunks {
		c.firsts++
		if c.cfg.FirstTokenTarget > 0 && call.FirstChunk > c.cfg.FirstTokenTarget {
			c.slow++
		}
	}
	c.mu.Unlock()
	if throttled {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// Run reports every interval, and on every throttle, until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Params.Interval)
	defer t.Stop()
	failing := false
	for {
		var r Report
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
			r = c.take(false)
		case <-t.C:
			r = c.take(true)
		}
		rctx, cancel := context.WithTimeout(ctx, reportTimeout)
		limit, err := c.store.Report(rctx, c.cfg.Name, r, c.cfg.Params)
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				failing = true
				c.log.Warn("adaptive concurrency: cannot report; keeping the last limit", "limit", c.Limit(), "name", c.cfg.Name, "err", err)
			}
			c.putBack(r)
			continue
		case failing:
			failing = false
			c.log.Info("adaptive concurrency: reporting again", "name", c.cfg.Name)
		}
		if was := int(c.limit.Swap(int64(limit))); was != limit && (limit < was || limit == c.cfg.Params.Ceiling) {
			// Decreases, and the return to the ceiling; not every +1.
			c.log.Info("adaptive concurrency: limit changed", "name", c.cfg.Name, "limit", limit, "was", was, "throttle", r.Throttle)
		}
		if c.onLimit != nil {
			c.onLimit(limit)
		}
	}
}

// take returns the report to send and resets what it covers: on the
// interval's tick everything (the first-token p99 judged over the
// interval), on a throttle's kick only the throttle.
func (c *Controller) take(tick bool) Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Report{Throttle: c.throttled}
	c.throttled = false
	if !tick {
		return r
	}
	r.Calls, c.calls = c.calls, 0
	// The p99 is above the target when more than 1 % of the first chunks
	// were slower than it.
	if c.slow > 0 && c.slow*100 > c.firsts {
		r.Throttle = true
	}
	c.firsts, c.slow = 0, 0
	return r
}

// putBack keeps an unreported report for the next one.
func (c *Controller) putBack(r Report) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls += r.Calls
	c.throttled = c.throttled || r.Throttle
}
