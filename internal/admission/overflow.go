package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Defaults of zero OverflowConfig fields, the QUEUE_* settings' defaults
// (docs/OPERATIONS.md).
const (
	DefaultOverflowThreshold     = 10000
	DefaultOverflowRefreshEvery  = time.Second
	DefaultOverflowRetryAfterMax = 60 * time.Second
	DefaultShedLowFraction       = 0.5
	DefaultShedNormalFraction    = 0.8
)

// DefaultOverflowHysteresis is QUEUE_OVERFLOW_HYSTERESIS' default; a zero
// OverflowConfig.Hysteresis is kept (0 is a valid setting).
const DefaultOverflowHysteresis = 500

// OverflowConfig configures the queue overflow gate. Zero fields take
// their defaults, except Hysteresis, where 0 is a valid setting.
type OverflowConfig struct {
	// Threshold is the backlog at which queued requests start being refused
	// (QUEUE_OVERFLOW_THRESHOLD, default 10000).
	Threshold int64
	// Hysteresis keeps refusing until the backlog is below
	// Threshold − Hysteresis, so the gate does not flap around the
	// threshold (QUEUE_OVERFLOW_HYSTERESIS; the setting's default is
	// DefaultOverflowHysteresis).
	Hysteresis int64
	// RefreshEvery is how often the cached depth is read again; a read
	// slower than this counts as failed (QUEUE_DEPTH_CACHE_TTL_MS, default 1s).
	RefreshEvery time.Duration
	// RetryAfterMax bounds the advised Retry-After, and is what is advised
	// while the backlog is not draining (QUEUE_RETRY_AFTER_SECONDS, default 60s).
	RetryAfterMax time.Duration
	// ShedLowFraction is the share of Threshold from which low-priority
	// requests are refused (QUEUE_SHED_LOW_FRACTION, default 0.5).
	ShedLowFraction float64
	// ShedNormalFraction is the share of Threshold from which normal
	// requests are refused (QUEUE_SHED_NORMAL_FRACTION, default 0.8); high
	// ones are refused at Threshold itself.
	ShedNormalFraction float64
}

func (c OverflowConfig) withDefaults() OverflowConfig {
	if c.ShedLowFraction == 0 {
		c.ShedLowFraction = DefaultShedLowFraction
	}
	if c.ShedNormalFraction == 0 {
		c.ShedNormalFraction = DefaultShedNormalFraction
	}
	if c.Threshold == 0 {
		c.Threshold = DefaultOverflowThreshold
	}
	if c.RefreshEvery == 0 {
		c.RefreshEvery = DefaultOverflowRefreshEvery
	}
	if c.RetryAfterMax == 0 {
		c.RetryAfterMax = DefaultOverflowRetryAfterMax
	}
	return c
}

// MinOverflowRefreshEvery is the shortest OverflowConfig.RefreshEvery:
// every api reads the backlog depth from Redis that often.
const MinOverflowRefreshEvery = 10 * time.Millisecond

// Validate reports bad values without changing c, each field out of range
// as a *bounds.Error. It checks the fields as given: NewOverflow fills the
// zero fields that have a default before it calls Validate.
func (c OverflowConfig) Validate() error {
	errs := []error{
		bounds.AtLeast("Threshold", c.Threshold, 1),
		bounds.AtLeast("Hysteresis", c.Hysteresis, 0),
		bounds.AtLeast("RefreshEvery", c.RefreshEvery, MinOverflowRefreshEvery),
		bounds.AtLeast("RetryAfterMax", c.RetryAfterMax, time.Second),
	}
	if c.Hysteresis >= 0 && c.Hysteresis >= c.Threshold {
		errs = append(errs, fmt.Errorf("Hysteresis %d must be below Threshold %d", c.Hysteresis, c.Threshold))
	}
	if !(c.ShedLowFraction > 0 && c.ShedLowFraction <= 1) { // written so NaN fails too
		errs = append(errs, &bounds.Error{Field: "ShedLowFraction", Value: c.ShedLowFraction,
			Rule: "must be above %v and at most %v", Bounds: []any{0.0, 1.0}})
	} else if !(c.ShedNormalFraction >= c.ShedLowFraction && c.ShedNormalFraction <= 1) {
		errs = append(errs, fmt.Errorf("ShedNormalFraction %g must be at least ShedLowFraction %g and at most 1",
			c.ShedNormalFraction, c.ShedLowFraction))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("admission: overflow: %w", err)
	}
	return nil
}

// drainWeight is the weight of the newest sample in the drain-rate EWMA:
// about the last four refreshes dominate, enough to smooth a bursty
// consumer tier without lagging a scale-up by more than a few seconds.
const drainWeight = 0.25

// Overflow is the queue overflow gate. It sheds by priority as the
// backlog grows (docs/OPERATIONS.md, "Priorities and shedding"): low from
// ShedLowFraction of the threshold, normal from ShedNormalFraction, high
// at the threshold, each with the hysteresis scaled to its level. Check is
// what the request path calls; it reads only state cached by Run, which reads the backlog depth
// in the background every RefreshEvery. Overflow is safe for concurrent
// use; Run must run once, in a goroutine its owner waits for.
type Overflow struct {
	cfg      OverflowConfig
	backlog  Backlog
	m        *metrics.Metrics
	rejected [3]prometheus.Counter // by Priority.Rank
	levels   [3]shedLevel          // by Priority.Rank
	log      *slog.Logger

	// Read on every Check; written by refresh. Indexed by Priority.Rank.
	refusing   [3]atomic.Bool
	retryAfter [3]atomic.Int64 // seconds advised while refusing
	cached     atomic.Int64
	waiting    atomic.Int64 // jobs no worker has taken, as last read

	mu        sync.Mutex // serialises refresh
	failing   bool       // inside a streak of failed reads
	failed    int        // reads failed in the current streak
	sampled   bool       // lastDepth and lastAt hold a sample
	lastDepth int64
	lastAt    time.Time
	rated     bool    // drainRate holds an estimate
	drainRate float64 // jobs per second leaving the backlog; negative while it grows
}

// Backlog is what the overflow gate reads in the background: the jobs
// accepted and not yet acknowledged (failover.Depther). A Backlog that can
// also tell the jobs no worker has taken yet (Waiting, as Redis Streams
// can) feeds QueueFirst with them; otherwise the whole backlog counts as
// waiting.
type Backlog interface {
	Depth(ctx context.Context) (int64, error)
}

// waitingCounter is the optional ability of a Backlog described above.
type waitingCounter interface {
	Waiting(ctx context.Context) (int64, error)
}

// NewOverflow returns the gate. backlog is read only by Run, never by
// Check. The gate accepts until the first refresh says otherwise.
func NewOverflow(cfg OverflowConfig, backlog Backlog, m *metrics.Metrics, log *slog.Logger) (*Overflow, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if backlog == nil || m == nil || log == nil {
		return nil, errors.New("admission: overflow needs a backlog, metrics and logger")
	}
	o := &Overflow{cfg: cfg, backlog: backlog, m: m, log: log, levels: shedLevels(cfg)}
	for _, p := range protocol.Priorities {
		o.rejected[p.Rank()] = m.QueueRejections.WithLabelValues("overflow", string(p))
		o.retryAfter[p.Rank()].Store(int64(protocol.RetryAfterSeconds(cfg.RetryAfterMax)))
	}
	m.QueueThreshold.Set(float64(cfg.Threshold))
	return o, nil
}

// shedLevel is where one priority starts being refused (at) and the
// backlog it must fall below to be accepted again (resume).
type shedLevel struct{ at, resume int64 }

// shedLevels places each priority's level: a fraction of the threshold,
// rounded up so a fraction of 1 is the threshold itself, with the
// hysteresis scaled by the same fraction so a low level keeps a band
// proportionate to it (and never reaches zero: Hysteresis < Threshold).
func shedLevels(c OverflowConfig) [3]shedLevel {
	var out [3]shedLevel
	for rank, f := range [3]float64{c.ShedLowFraction, c.ShedNormalFraction, 1} {
		at := max(1, int64(math.Ceil(f*float64(c.Threshold))))
		h := c.Hysteresis * at / c.Threshold
		out[rank] = shedLevel{at: at, resume: at - h}
	}
	return out
}

// Threshold is QUEUE_OVERFLOW_THRESHOLD, the backlog at which even high
// priority requests are refused.
func (o *Overflow) Threshold() int64 { return o.cfg.Threshold }

// Run refreshes the cached depth at once and then every RefreshEvery
// until ctx ends.
func (o *Overflow) Run(ctx context.Context) {
	o.refresh(ctx, time.Now())
	t := time.NewTicker(o.cfg.RefreshEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			o.refresh(ctx, now)
		}
	}
}

// Check returns nil to accept a request of priority prio for the queue,
// or a 503 queue-overflow problem with Retry-After while the backlog is
// over that priority's level (and, once over, until it falls below the
// level's resume point). It never reads the queue. Each refusal counts in
// spillway_queue_rejections_total{reason="overflow",priority}.
func (o *Overflow) Check(prio protocol.Priority) *protocol.Problem {
	r := prio.Rank()
	if !o.refusing[r].Load() {
		return nil
	}
	o.rejected[r].Inc()
	return protocol.QueueOverflow(int(o.retryAfter[r].Load()))
}

// Depth returns the backlog as last read (0 before the first read).
func (o *Overflow) Depth() int64 { return o.cached.Load() }

// Waiting returns the jobs no worker has taken, as last read (0 before
// the first read): while it is above zero and the pool is full, new
// requests queue behind them (Gate.QueueFirst; docs/QUEUE.md, invariant 4).
func (o *Overflow) Waiting() int64 { return o.waiting.Load() }

// refresh reads the depth once and updates the cached state; now is the
// time of the read.
func (o *Overflow) refresh(ctx context.Context, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, o.cfg.RefreshEvery)
	wc, canTell := o.backlog.(waitingCounter)
	if canTell {
		if n, err := wc.Waiting(rctx); err == nil {
			o.waiting.Store(n)
		}
	}
	d, err := o.backlog.Depth(rctx)
	cancel()
	if err == nil && !canTell {
		o.waiting.Store(d)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down, not a failed read
		}
		o.failed++
		if !o.failing {
			o.failing = true
			o.log.Warn("queue depth read failed; keeping the last value", "depth", o.cached.Load(), "err", err)
		}
		return
	}
	if o.failing {
		o.failing = false
		o.log.Info("queue depth read works again", "failed_reads", o.failed, "depth", d)
		o.failed = 0
	}

	if o.sampled {
		if dt := now.Sub(o.lastAt).Seconds(); dt > 0 {
			rate := float64(o.lastDepth-d) / dt
			if o.rated {
				rate = drainWeight*rate + (1-drainWeight)*o.drainRate
			}
			o.drainRate, o.rated = rate, true
		}
	}
	o.sampled, o.lastDepth, o.lastAt = true, d, now
	o.cached.Store(d)
	o.m.QueueDepth.Set(float64(d))

	for _, p := range protocol.Priorities {
		r, lvl := p.Rank(), o.levels[p.Rank()]
		was := o.refusing[r].Load()
		refusing := d >= lvl.at || (was && d >= lvl.resume)
		if refusing {
			o.retryAfter[r].Store(int64(protocol.RetryAfterSeconds(o.retryAfterFor(d, lvl.resume))))
		}
		o.refusing[r].Store(refusing)
		switch {
		case refusing && !was:
			o.log.Warn("queue backlog at shedding level: refusing queued requests", "priority", p,
				"depth", d, "level", lvl.at, "threshold", o.cfg.Threshold)
		case !refusing && was:
			o.log.Info("queue backlog below resume level: accepting queued requests", "priority", p,
				"depth", d, "resume_below", lvl.resume)
		}
	}
}

// retryAfterFor estimates, in whole seconds, how long a backlog of d takes
// to fall below resume at the observed drain rate, clamped to
// [1s, RetryAfterMax]; RetryAfterMax when it is not draining.
func (o *Overflow) retryAfterFor(d, resume int64) time.Duration {
	maxSecs := float64(protocol.RetryAfterSeconds(o.cfg.RetryAfterMax))
	if !o.rated || o.drainRate <= 0 {
		return time.Duration(maxSecs) * time.Second
	}
	excess := float64(d - resume + 1)
	secs := math.Min(math.Max(math.Ceil(excess/o.drainRate), 1), maxSecs)
	return time.Duration(secs) * time.Second
}
