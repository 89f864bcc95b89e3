package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// DegradeSignals are the inputs of the degradation level 0–3 (normal,
// elevated, high, critical), each read once a second. Thresholds for levels
// 1 / 2 / 3: backlog 10 / 50 / 80 % of the overflow threshold, queue wait
// p99 5 / 15 / 25 s, provider error rate 5 / 20 / 50 %, heap 70 / 80 / 90 %
// of GOMEMLIMIT. The Degrader is not wired into the api yet: the gauge
// spillway_degradation_level and the level's effects on admission come
// with it.
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

// Degrader computes the degradation level 0–3 from its inputs: a level is
// entered at once and left only after the signals stayed below it for
// DegradeHold. Level is safe for concurrent use; Step and Run must be
// called from one goroutine.
type Degrader struct {
	in    DegradeInputs
	level atomic.Int32

	mu         sync.Mutex
	belowSince time.Time // when the signals fell below the current level; zero while not below
}

// NewDegrader returns a degrader at level 0.
func NewDegrader(in DegradeInputs) *Degrader { return &Degrader{in: in} }

// Level returns the current level.
func (d *Degrader) Level() int { return int(d.level.Load()) }

// Step reads the signals once at now and updates the level.
func (d *Degrader) Step(now time.Time) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	target, cur := levelOf(d.in.Signals()), int(d.level.Load())
	switch {
	case target >= cur:
		d.belowSince = time.Time{}
		cur = target
	case d.belowSince.IsZero():
		d.belowSince = now
	case now.Sub(d.belowSince) >= DegradeHold:
		// Below for the whole hold: settle where the signals are now, and
		// start a new hold for any lower level.
		cur, d.belowSince = target, time.Time{}
	}
	d.level.Store(int32(cur))
	return cur
}

// Run steps once a second until ctx ends, calling set with each level
// (the spillway_degradation_level gauge).
func (d *Degrader) Run(ctx context.Context, set func(level int)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			set(d.Step(now))
		}
	}
}
