package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// DegradeSignals are the inputs of the degradation level 0–3 (normal,
// elevated, high, critical), read once a second (docs/OPERATIONS.md,
// "Degradation levels"). Thresholds for levels 1 / 2 / 3: backlog
// 10 / 50 / 80 % of the overflow threshold, queue wait p99 5 / 15 / 25 s,
// request failure rate 5 / 20 / 50 %, heap 70 / 80 / 90 % of GOMEMLIMIT.
type DegradeSignals struct {
	// BacklogFraction is the queue backlog over QUEUE_OVERFLOW_THRESHOLD.
	BacklogFraction float64
	// QueueWaitP99 is the 99th percentile queue wait over the last minute.
	QueueWaitP99 time.Duration
	// ErrorRate is the share of the requests that ended over the last
	// minute which failed for a reason the provider owns, 0 to 1
	// (Recent.ObserveRequest).
	ErrorRate float64
	// Requests is how many requests ended over the last minute, failed or
	// not: ErrorRate counts only from DegradeConfig.MinRequests of them.
	Requests int64
	// LatestErrorRate is ErrorRate over the latest 5 to 10 s only: the
	// failure rate reaches a level only while this one does too, so the
	// level is left soon after failures stop, not once they aged out of
	// the minute.
	LatestErrorRate float64
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

// DegradeRaiseAfter is how long the failure rate must stay at or above a
// level's threshold before it raises the level: a burst the fleet
// absorbed refuses nobody (docs/OPERATIONS.md, "What does not degrade").
const DegradeRaiseAfter = 10 * time.Second

// Defaults of DegradeConfig: DEGRADE_MAX_TOKENS, DEGRADE_MIN_REQUESTS and
// DEGRADE_PROBE_EVERY.
const (
	DefaultDegradeMaxTokens   = 1024
	DefaultDegradeMinRequests = 20
	DefaultDegradeProbeEvery  = 10
)

// degradeThresholds are the values at which levels 1, 2 and 3 start.
var (
	backlogLevels = [3]float64{0.10, 0.50, 0.80}
	waitLevels    = [3]time.Duration{5 * time.Second, 15 * time.Second, 25 * time.Second}
	errorLevels   = [3]float64{0.05, 0.20, 0.50}
	heapLevels    = [3]float64{0.70, 0.80, 0.90}
)

// The inputs, as named in spillway_degradation_input{input} and in the
// log line of a level change.
const (
	InputBacklog   = "backlog_fraction"
	InputQueueWait = "queue_wait_p99_seconds"
	InputErrorRate = "error_rate"
	InputLatest    = "latest_error_rate"
	InputRequests  = "requests"
	InputHeap      = "heap_fraction"
)

// degradeInputs are the inputs with a gauge, in log order.
var degradeInputs = [...]string{InputBacklog, InputQueueWait, InputErrorRate, InputLatest, InputRequests, InputHeap}

// inputLevels are the levels the inputs that act at once reach, by name
// (backlog, queue wait, heap).
func inputLevels(s DegradeSignals) map[string]int {
	lv := map[string]int{}
	for i := range 3 {
		if s.BacklogFraction >= backlogLevels[i] {
			lv[InputBacklog] = i + 1
		}
		if s.QueueWaitP99 >= waitLevels[i] {
			lv[InputQueueWait] = i + 1
		}
		if s.HeapFraction > 0 && s.HeapFraction >= heapLevels[i] {
			lv[InputHeap] = i + 1
		}
	}
	return lv
}

// errorThreshold is the level the failure rate's thresholds put rate at,
// before the minimum count, the raise delay and the cap.
func errorThreshold(rate float64) int {
	lvl := 0
	for i, t := range errorLevels {
		if rate >= t {
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
	// MinRequests is the fewest requests that must have ended in the
	// last minute before their failure rate counts toward a level
	// (DEGRADE_MIN_REQUESTS). Default 20.
	MinRequests int
	// ProbeEvery admits one normal request in this many at level 3, so
	// the last minute keeps learning while the level refuses
	// (DEGRADE_PROBE_EVERY). Default 10.
	ProbeEvery int
	// Hold is how long the signals must stay below a level before it is
	// left. Default DegradeHold (30s); tests shorten it.
	Hold time.Duration
	// RaiseAfter is how long the failure rate must stay at or above a
	// level's threshold before it raises the level. Default
	// DegradeRaiseAfter (10s); tests shorten it.
	RaiseAfter time.Duration
	// RetryAfterMax bounds the Retry-After of a refusal
	// (QUEUE_RETRY_AFTER_SECONDS). Default 60s.
	RetryAfterMax time.Duration
}

func (c DegradeConfig) withDefaults() DegradeConfig {
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultDegradeMaxTokens
	}
	if c.MinRequests == 0 {
		c.MinRequests = DefaultDegradeMinRequests
	}
	if c.ProbeEvery == 0 {
		c.ProbeEvery = DefaultDegradeProbeEvery
	}
	if c.Hold == 0 {
		c.Hold = DegradeHold
	}
	if c.RaiseAfter == 0 {
		c.RaiseAfter = DegradeRaiseAfter
	}
	if c.RetryAfterMax == 0 {
		c.RetryAfterMax = DefaultOverflowRetryAfterMax
	}
	return c
}

// Validate reports bad values without changing c, each field out of range
// as a *bounds.Error. It checks the fields as given: NewDegrader fills the
// zero fields that have a default before it calls Validate.
func (c DegradeConfig) Validate() error {
	err := errors.Join(
		bounds.AtLeast("MaxTokens", c.MaxTokens, 1),
		bounds.AtLeast("MinRequests", c.MinRequests, 1),
		bounds.AtLeast("ProbeEvery", c.ProbeEvery, 1),
		bounds.AtLeast("Hold", c.Hold, 0),
		bounds.AtLeast("RaiseAfter", c.RaiseAfter, 0),
		bounds.AtLeast("RetryAfterMax", c.RetryAfterMax, time.Second),
	)
	if err != nil {
		return fmt.Errorf("admission: degrade: %w", err)
	}
	return nil
}

// Degrader computes the degradation level 0–3 from its inputs and applies
// its effects to admission (docs/OPERATIONS.md, "Degradation levels").
// Backlog, queue wait and heap raise a level at once; the failure rate
// counts only from MinRequests ended requests, raises a level only after
// staying at or above its threshold for RaiseAfter, and on its own never
// reaches level 3 ("Degradation must never be the outage"). A level is
// left only once the signals stayed below it for Hold, each level on its
// own clock, so falling from 3 to 1 passes through 2 when the signals
// were at 2 less than Hold ago. Level 2 refuses low priority and caps a
// normal request's max_tokens, level 3 admits only high and one normal
// request in ProbeEvery.
//
// Level, Check and MaxTokens are safe for concurrent use and read only
// atomics; Step and Run must be called from one goroutine.
type Degrader struct {
	cfg    DegradeConfig
	in     DegradeInputs
	log    *slog.Logger
	gauge  prometheus.Gauge
	inputs *prometheus.GaugeVec // spillway_degradation_input{input}; nil without metrics
	// refused counts refusals, by Priority.Rank.
	refused [3]prometheus.Counter
	level   atomic.Int32
	// probes counts the normal requests Check saw at level 3.
	probes atomic.Uint64

	mu      sync.Mutex
	lastAt  [3]time.Time // when the signals last reached levels 1, 2, 3
	errorAt [3]time.Time // since when the failure rate stayed at levels 1, 2, 3; zero when below
}

// NewDegrader returns a degrader at level 0. m and log may be nil (no
// metrics, slog.Default).
func NewDegrader(cfg DegradeConfig, in DegradeInputs, m *metrics.Metrics, log *slog.Logger) (*Degrader, error) {
	cfg = cfg.withDefaults()
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
		d.gauge, d.inputs = m.DegradationLevel, m.DegradationInput
		for _, p := range protocol.Priorities {
			d.refused[p.Rank()] = m.QueueRejections.WithLabelValues(ReasonDegraded, string(p))
		}
		d.gauge.Set(0)
		for _, name := range degradeInputs {
			d.inputs.WithLabelValues(name).Set(0)
		}
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
// for everything but high, except one normal request in ProbeEvery, whose
// outcome keeps the last minute current while the level refuses. The
// Retry-After is the hold, since the level is not left sooner, within
// [1s, RetryAfterMax].
func (d *Degrader) Check(prio protocol.Priority) *protocol.Problem {
	lvl := d.Level()
	prio = prio.OrNormal()
	refuse := (lvl >= LevelHigh && prio.Rank() < protocol.PriorityNormal.Rank()) ||
		(lvl >= LevelCritical && prio.Rank() < protocol.PriorityHigh.Rank())
	if !refuse {
		return nil
	}
	if prio == protocol.PriorityNormal && d.probes.Add(1)%uint64(d.cfg.ProbeEvery) == 0 {
		return nil
	}
	if c := d.refused[prio.Rank()]; c != nil {
		c.Inc()
	}
	ra := min(d.cfg.Hold, d.cfg.RetryAfterMax)
	return protocol.QueueOverflow(protocol.RetryAfterSeconds(ra))
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

// errorLevel updates the failure rate's clocks at now and returns the
// level it raises: the highest whose threshold the rate, of the minute and
// of its latest seconds alike, stayed at or above for RaiseAfter, with at
// least MinRequests ended requests behind it, and never level 3 (a second
// input must be critical too).
func (d *Degrader) errorLevel(s DegradeSignals, now time.Time) int {
	at := 0
	if s.Requests >= int64(d.cfg.MinRequests) {
		at = min(errorThreshold(s.ErrorRate), errorThreshold(s.LatestErrorRate))
	}
	lvl := 0
	for i := range d.errorAt {
		switch {
		case i >= at:
			d.errorAt[i] = time.Time{}
		case d.errorAt[i].IsZero():
			d.errorAt[i] = now
		}
		if !d.errorAt[i].IsZero() && now.Sub(d.errorAt[i]) >= d.cfg.RaiseAfter {
			lvl = i + 1
		}
	}
	return min(lvl, LevelHigh)
}

// Step reads the signals once at now and updates the level.
func (d *Degrader) Step(now time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.in.Signals()
	levels := inputLevels(s)
	if l := d.errorLevel(s, now); l > 0 {
		levels[InputErrorRate] = l
	}
	target := 0
	for _, l := range levels {
		target = max(target, l)
	}
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
		// The inputs at the new level name why it was entered (or, on
		// the way down, what holds it; none when only the hold does).
		var why []string
		for _, name := range degradeInputs {
			if l, ok := levels[name]; ok && l == lvl {
				why = append(why, name)
			}
		}
		log("degradation level changed", "level", lvl, "was", was, "input", strings.Join(why, ","),
			"backlog_fraction", s.BacklogFraction, "queue_wait_p99", s.QueueWaitP99.String(),
			"error_rate", s.ErrorRate, "latest_error_rate", s.LatestErrorRate, "requests", s.Requests, "heap_fraction", s.HeapFraction)
	}
	if d.gauge != nil {
		d.gauge.Set(float64(lvl))
		d.inputs.WithLabelValues(InputBacklog).Set(s.BacklogFraction)
		d.inputs.WithLabelValues(InputQueueWait).Set(s.QueueWaitP99.Seconds())
		d.inputs.WithLabelValues(InputErrorRate).Set(s.ErrorRate)
		d.inputs.WithLabelValues(InputLatest).Set(s.LatestErrorRate)
		d.inputs.WithLabelValues(InputRequests).Set(float64(s.Requests))
		d.inputs.WithLabelValues(InputHeap).Set(s.HeapFraction)
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
