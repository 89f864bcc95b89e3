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
// over (docs/OPERATIONS.md, "Memory after a burst"). The Go runtime
// collects only when the heap grows: a process that falls quiet after
// 10,000 streams keeps their garbage, and the pages under it, until its
// two-minute forced collection, and its scavenger returns free pages a
// little at a time. Every stream holds at least one goroutine, so the
// goroutine count follows the open streams: when it has fallen by at
// least burstGoroutines from its peak since the last return, memReturner
// collects twice (the second frees what sync.Pools, such as net/http's
// connection buffers, held through the first) and returns every free
// page (debug.FreeOSMemory). The heap left after a burst is small, so
// this costs little, and it runs at most once per minReturnGap.
type memReturner struct {
	log      *slog.Logger
	interval time.Duration
	peak     int // goroutines, since the last return
	last     time.Time
	sample   []metrics.Sample
}

const (
	// burstGoroutines is how far the goroutine count must fall from its
	// peak: about 500 streams (two goroutines each while they wait).
	burstGoroutines = 1000
	// minReturnGap bounds how often memory is returned.
	minReturnGap = 30 * time.Second
	// memReturnInterval is how often the goroutine count is read.
	memReturnInterval = 5 * time.Second
)

func newMemReturner(log *slog.Logger) *memReturner {
	return &memReturner{log: log, interval: memReturnInterval,
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

// check reads the goroutine count and returns memory when a burst ended;
// it reports whether it did.
func (m *memReturner) check(now time.Time) bool {
	metrics.Read(m.sample)
	n := int(m.sample[0].Value.Uint64())
	m.peak = max(m.peak, n)
	if m.peak-n < burstGoroutines || now.Sub(m.last) < minReturnGap {
		return false
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	runtime.GC()
	debug.FreeOSMemory()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	m.log.Info("a burst of streams ended: memory returned to the system",
		"goroutines_peak", m.peak, "goroutines", n,
		"heap_retained_before", before.HeapSys-before.HeapReleased, "heap_retained_after", after.HeapSys-after.HeapReleased)
	m.peak, m.last = n, now
	return true
}
