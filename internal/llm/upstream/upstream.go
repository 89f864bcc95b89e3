package upstream

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
)

// ewmaDecay is the peak-EWMA time constant: an observation weighs half
// after about 7s. Finagle's default.
const ewmaDecay = 10 * time.Second

// Upstream is the balancer's live view of one configured upstream: the
// spec, its provider and what routing reads (load, latency, quota state).
type Upstream struct {
	// Spec is the upstream as configured.
	Spec Spec

	index    int
	nameHash uint64
	provider llm.Provider
	caps     Caps    // nil when uncapped
	circuit  Circuit // nil when the provider has no circuit of its own

	local      atomic.Int64 // calls in flight from this process
	quotaUntil atomic.Int64 // Unix ns before which the quota is known spent
	trialAfter atomic.Int64 // Unix ns before which this process does not claim a trial again
	shown      atomic.Int32 // healthy gauge last reported: 0 unknown, 1 healthy, 2 not

	lat peakEWMA
}

// Load returns the calls in flight on u as routing sees them: the
// cluster-wide count of its cap when it has one (as last learnt, no I/O),
// else this process's own calls.
func (u *Upstream) Load() int {
	if u.caps != nil {
		return max(u.caps.Load(u.index), int(u.local.Load()))
	}
	return int(u.local.Load())
}

// openFor returns how long u's circuit still refuses calls; 0 without one.
func (u *Upstream) openFor() time.Duration {
	if u.circuit == nil {
		return 0
	}
	return u.circuit.OpenFor()
}

// latencyScore is the latency router's cost: peak-EWMA first-chunk latency
// in seconds × (load + 1). An upstream never measured scores 0, so it gets
// tried.
func (u *Upstream) latencyScore() float64 {
	return u.lat.valueAt(time.Now()) * float64(u.Load()+1)
}

// peakEWMA tracks first-chunk latency: a slower observation is taken at
// once (peak), a faster one is averaged in with a weight that grows with
// the time since the last, so a replica that slowed down is avoided at
// once and trusted again gradually. Read, the cost also decays toward 0
// with the time since the last observation (Finagle reads it by observing
// 0): a replica avoided after one slow call is not avoided for ever for
// want of new observations, it is tried again once its cost has decayed
// below the others'.
type peakEWMA struct {
	mu    sync.Mutex
	cost  float64 // seconds
	stamp time.Time
}

func (e *peakEWMA) observe(d time.Duration, now time.Time) {
	rtt := d.Seconds()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stamp.IsZero() || rtt > e.cost {
		e.cost = rtt
	} else {
		w := math.Exp(-float64(now.Sub(e.stamp)) / float64(ewmaDecay))
		e.cost = e.cost*w + rtt*(1-w)
	}
	e.stamp = now
}

// valueAt returns the cost at now, decayed since the last observation.
func (e *peakEWMA) valueAt(now time.Time) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stamp.IsZero() || !now.After(e.stamp) {
		return e.cost
	}
	return e.cost * math.Exp(-float64(now.Sub(e.stamp))/float64(ewmaDecay))
}
