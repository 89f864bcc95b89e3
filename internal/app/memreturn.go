package app

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// memReturner gives memory back to the system once a burst of streams is
// over, and once one has settled (docs/OPERATIONS.md, "Memory after a
// burst"). The Go runtime collects only when the heap grows: a process
// that falls quiet after 10,000 streams keeps their garbage, and the pages
// under it, until its two-minute forced collection, and its scavenger
// returns free pages a little at a time. Every stream holds at least one
// goroutine, so the goroutine count follows the open streams: when it has
// fallen by at least burstGoroutines from its peak since the last return,
// memReturner collects twice (the second frees what sync.Pools, such as
// net/http's connection buffers, held through the first) and returns
// every free page (debug.FreeOSMemory). The heap left after a burst is
// small, so this costs little, and it runs at most once per minReturnGap.
//
// A burst that rose by burstGoroutines and then held steady for one
// interval (moved by less than a fiftieth of that) gets the same, once, with
// one collection, whenever it settles: minReturnGap does not hold it
// back, so what 10,000 waiting streams hold once settled does not depend
// on when the last return happened. A ramp that stalled for an interval
// looks settled too; so a settled return keeps the low, and the burst
// settles again, with another return, once the count moved by a tenth of
// a burst since and held still again: the end of the ramp is returned
// too. That is at most one return every two intervals, and none while
// the count holds still. The reason: a stream's goroutine
// needs a 16 KiB stack while it is admitted and handed to the queue, and only 8 KiB once it waits, so by
// the time a collection has shrunk them the 10,000 streams of a burst
// leave some 80 MB of free pages that the scavenger would keep (its goal
// follows the heap goal, twice the live heap). Returning them costs one
// collection of the plateau's heap, once per burst.
type memReturner struct {
	log      *slog.Logger
	interval time.Duration
	peak     int // goroutines, since the last return
	low      int // goroutines, since the last return
	prev     int // goroutines at the last check; -1 before the first
	settledN int // goroutines at the last settled return; -1 after any other
	last     time.Time
	sample   []metrics.Sample
}

const (
	// burstGoroutines is how far the goroutine count must fall from its
	// peak, or rise from its low: about 500 streams (two goroutines each
	// while they wait).
	burstGoroutines = 1000
	// settledGoroutines is how far a settled burst's count must have
	// moved since its last return for a settled return to come again.
	settledGoroutines = burstGoroutines / 10
	// stillGoroutines is how little the count may move in one interval
	// for a risen burst to count as settled: about ten streams a second.
	stillGoroutines = burstGoroutines / 50
	// minReturnGap bounds how often memory is returned after a burst
	// ended.
	minReturnGap = 30 * time.Second
	// memReturnInterval is how often the goroutine count is read: a
	// second, so the pages of a burst that settled are returned a second
	// or two after its last stream arrived (a read costs a few hundred
	// nanoseconds).
	memReturnInterval = time.Second
)

func newMemReturner(log *slog.Logger) *memReturner {
	return &memReturner{log: log, interval: memReturnInterval, low: -1, prev: -1, settledN: -1,
		sample: []metrics.Sample{{Name: "/sched/goroutines:goroutines"}}}
}

// Run watches until ctx ends.
func (m *memReturner) Run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m.check(now)
		}
	}
}

// check reads the goroutine count and returns memory when a burst ended
// or settled; it reports whether it did.
func (m *memReturner) check(now time.Time) bool {
	metrics.Read(m.sample)
	n := int(m.sample[0].Value.Uint64())
	prev := m.prev
	m.prev = n
	m.peak = max(m.peak, n)
	if m.low < 0 || n < m.low {
		m.low = n
	}
	ended := m.peak-n >= burstGoroutines
	settled := n-m.low >= burstGoroutines && prev >= 0 && abs(n-prev) < stillGoroutines &&
		(m.settledN < 0 || abs(n-m.settledN) >= settledGoroutines)
	if !ended && !settled || !settled && now.Sub(m.last) < minReturnGap {
		return false
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	if ended {
		// What sync.Pools kept through one collection goes in the second
		// (FreeOSMemory's); streams that still wait need no such help, and
		// the plateau's heap is large, so a settled burst gets one.
		runtime.GC()
	}
	debug.FreeOSMemory()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	msg := "a burst of streams ended: memory returned to the system"
	if !ended {
		msg = "a burst of streams settled: memory returned to the system"
	}
	m.log.Info(msg, "goroutines_peak", m.peak, "goroutines_low", m.low, "goroutines", n,
		"heap_retained_before", before.HeapSys-before.HeapReleased, "heap_retained_after", after.HeapSys-after.HeapReleased)
	if ended {
		m.peak, m.low, m.settledN = n, n, -1
	} else {
		// The low stays: the rest of a ramp that stalled still counts
		// as the burst's rise (settledN keeps a still count from
		// returning again).
		m.peak, m.settledN = n, n
	}
	m.last = now
	return true
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
