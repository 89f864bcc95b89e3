package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// DegradeSignals are the inputs of the degradation level 0–3 (normal,
// elevated, high, critical), read once a second (docs/OPERATIONS.md,
// "Degradation levels"). Thresholds for levels 1 / 2 / 3: backlog
// 10 / 50 / 80 % of the overflow threshold, queue wait p99 5 / 15 / 25 s,
// provider error rate 5 / 20 / 50 %, heap 70 / 80 / 90 % of GOMEMLIMIT.
type DegradeSignals struct {
	// BacklogFraction is the queue backlog over QUEUE_OVERFLOW_THRESHOLD.
	BacklogFraction float64
	// QueueWaitP99 is the 99th percentile queue wait over the last minute.
	QueueWaitP99 time.Duration
	// ErrorRate is the share of provider calls that failed over the last
	// minute, 0 to 1.
	ErrorRate float64
	// HeapFraction is the Go heap over GOMEMLIMIT; 0 when no limit is set.
	HeapFraction float64
}

// DegradeInputs tells the current signals. Signals is called from one
// goroutine, once a second, and must not block on I/O: implementations
// answer from state cached elsewhere.
type DegradeInputs interface {
	Signals() DegradeSignals
}

// DegradeHold is how long every signal must stay below a level's
// thresholds before that level is left, so the level does not flap.
const DegradeHold = 30 * time.Second

// DefaultDegradeMaxTokens is the default DegradeConfig.MaxTokens
// (DEGRADE_MAX_TOKENS).
const DefaultDegradeMaxTokens = 1024

// degradeThresholds are the values at which levels 1, 2 and 3 start.
var (
	backlogLevels = [3]float64{0.10, 0.50, 0.80}
	waitLevels    = [3]time.Duration{5 * time.Second, 15 * time.Second, 25 * time.Second}
	errorLevels   = [3]float64{0.05, 0.20, 0.50}
	heapLevels    = [3]float64{0.70, 0.80, 0.90}
)

// levelOf is the highest level any signal reaches.
func levelOf(s DegradeSignals) int {
	lvl := 0
	for i := range 3 {
		if s.BacklogFraction >= backlogLevels[i] || s.QueueWaitP99 >= waitLevels[i] ||
			s.ErrorRate >= errorLevels[i] || (s.HeapFraction > 0 && s.HeapFraction >= heapLevels[i]) {
			lvl = i + 1
		}
	}
	return lvl
}

// Degradation levels, as spillway_degradation_level reports them.
const (
	LevelNormal   = 0
	LevelElevated = 1
	LevelHigh     = 2
	LevelCritical = 3
)

// DegradeConfig configures a Degrader. Zero fields take their defaults.
type DegradeConfig struct {
	// MaxTokens caps a normal request's max_tokens from level 2
	// (DEGRADE_MAX_TOKENS). Default 1024.
	MaxTokens int
	// Hold is how long the signals must stay below a level before it is
	// left. Default DegradeHold (30s); tests shorten it.
	Hold time.Duration
	// RetryAfterMax bounds the Retry-After of a refusal
	// (QUEUE_RETRY_AFTER_SECONDS). Default 60s.
	RetryAfterMax time.Duration
}

func (c DegradeConfig) withDefaults() DegradeConfig {
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultDegradeMaxTokens
	}
	if c.Hold == 0 {
		c.Hold = DegradeHold
	}
	if c.RetryAfterMax == 0 {
		c.RetryAfterMax = DefaultOverflowRetryAfterMax
	}
	return c
}

// Validate reports bad values without changing c.
func (c DegradeConfig) Validate() error {
	var errs []error
	if c.MaxTokens < 0 {
		errs = append(errs, fmt.Errorf("admission: degrade MaxTokens %d must not be negative", c.MaxTokens))
	}
	if c.Hold < 0 {
		errs = append(errs, fmt.Errorf("admission: degrade Hold %s must not be negative", c.Hold))
	}
	if c.RetryAfterMax < 0 || (c.RetryAfterMax > 0 && c.RetryAfterMax < time.Second) {
		errs = append(errs, errors.New("admission: degrade RetryAfterMax must be at least 1s"))
	}
	return errors.Join(errs...)
}

// Degrader computes the degradation level 0–3 from its inputs and applies
// its effects to admission (docs/OPERATIONS.md, "Degradation levels"): a
// level is entered at once and left only once the signals stayed below it
// for Hold, each level on its own clock, so falling from 3 to 1 passes
// through 2 when the signals were at 2 less than Hold ago. Level 2
// refuses low priority and caps a normal request's max_tokens, level 3
// admits only high.
//
// Level, Check and MaxTokens are safe for concurrent use and read only an
// atomic; Step and Run must be called from one goroutine.
type Degrader struct {
	cfg   DegradeConfig
	in    DegradeInputs
	log   *slog.Logger
	gauge prometheus.Gauge
	// refused counts refusals, by Priority.Rank.
	refused [3]prometheus.Counter
	level   atomic.Int32

	mu     sync.Mutex
	lastAt [3]time.Time // when the signals last reached levels 1, 2, 3
}

// NewDegrader returns a degrader at level 0. m and log may be nil (no
// metrics, slog.Default).
func NewDegrader(cfg DegradeConfig, in DegradeInputs, m *metrics.Metrics, log *slog.Logger) (*Degrader, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if in == nil {
		return nil, errors.New("admission: degrader needs inputs")
	}
	if log == nil {
		log = slog.Default()
	}
	d := &Degrader{cfg: cfg.withDefaults(), in: in, log: log}
	if m != nil {
		d.gauge = m.DegradationLevel
		for _, p := range protocol.Priorities {
			d.refused[p.Rank()] = m.QueueRejections.WithLabelValues(ReasonDegraded, string(p))
		}
		d.gauge.Set(0)
	}
	return d, nil
}

// ReasonDegraded is the reason label of spillway_queue_rejections_total
// for a request refused by the degradation level.
const ReasonDegraded = "degraded"

// Level returns the current level.
func (d *Degrader) Level() int { return int(d.level.Load()) }

// Check returns nil to admit a request of priority prio at the current
// level, or a 503 queue-overflow problem: from level 2 for low, at level 3
// for everything but high. The Retry-After is the hold, since the level
// is not left sooner, within [1s, RetryAfterMax].
func (d *Degrader) Check(prio protocol.Priority) *protocol.Problem {
	lvl := d.Level()
	refuse := (lvl >= LevelHigh && prio.Rank() < protocol.PriorityNormal.Rank()) ||
		(lvl >= LevelCritical && prio.Rank() < protocol.PriorityHigh.Rank())
	if !refuse {
		return nil
	}
	if c := d.refused[prio.OrNormal().Rank()]; c != nil {
		c.Inc()
	}
	ra := min(d.cfg.Hold, d.cfg.RetryAfterMax)
	return protocol.QueueOverflow(max(1, int((ra+time.Second-1)/time.Second)))
}

// MaxTokens returns the cap on max_tokens for a request of priority prio
// at the current level, or 0 for none: DEGRADE_MAX_TOKENS for normal from
// level 2 (low is refused there, high keeps what it asked for).
func (d *Degrader) MaxTokens(prio protocol.Priority) int {
	if d.Level() >= LevelHigh && prio.OrNormal() == protocol.PriorityNormal {
		return d.cfg.MaxTokens
	}
	return 0
}

// Step reads the signals once at now and updates the level.
func (d *Degrader) Step(now time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.in.Signals()
	target := levelOf(s)
	for i := range target {
		d.lastAt[i] = now
	}
	lvl := target
	for i := 2; i >= target; i-- {
		if !d.lastAt[i].IsZero() && now.Sub(d.lastAt[i]) < d.cfg.Hold {
			lvl = i + 1
			break
		}
	}
	if was := int(d.level.Swap(int32(lvl))); was != lvl {
		log := d.log.Info
		if lvl > was {
			log = d.log.Warn
		}
		log("degradation level changed", "level", lvl, "was", was,
			"backlog_fraction", s.BacklogFraction, "queue_wait_p99", s.QueueWaitP99.String(),
			"error_rate", s.ErrorRate, "heap_fraction", s.HeapFraction)
	}
	if d.gauge != nil {
		d.gauge.Set(float64(lvl))
	}
	return lvl
}

// Run steps once a second until ctx ends.
func (d *Degrader) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			d.Step(now)
		}
	}
}
