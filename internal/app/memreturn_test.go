package app

import (
	"runtime"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// The returner gives memory back once the goroutine count fell by a
// burst's worth from its peak, and not before; then not again within
// minReturnGap. Not parallel: it counts the process's goroutines.
func TestMemReturnerAfterBurst(t *testing.T) {
	m := newMemReturner(testutil.DiscardLogger())
	now := time.Now()
	if m.check(now) {
		t.Fatal("returned memory with no burst")
	}
	end := startBurst(2 * burstGoroutines)
	if m.check(now.Add(time.Second)) {
		t.Fatal("returned memory while the burst was still on")
	}
	// A sample of garbage the burst leaves: it must be freed and returned.
	leaveGarbage()
	end()
	testutil.Eventually(t, 10*time.Second, func() bool {
		return runtime.NumGoroutine() < m.peak-burstGoroutines
	}, "the burst's goroutines did not end")
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	if !m.check(now.Add(2 * time.Second)) {
		t.Fatalf("no return after the burst: peak %d goroutines, now %d", m.peak, runtime.NumGoroutine())
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if after.HeapReleased <= before.HeapReleased {
		t.Errorf("heap released %d → %d: nothing was returned", before.HeapReleased, after.HeapReleased)
	}
	if m.check(now.Add(3 * time.Second)) {
		t.Error("returned again within minReturnGap")
	}
}

// A burst that rose and then held steady gets its free pages returned
// once, not while it still rises; then not again within minReturnGap.
// Not parallel: it counts the process's goroutines.
func TestMemReturnerAfterSettledBurst(t *testing.T) {
	m := newMemReturner(testutil.DiscardLogger())
	now := time.Now()
	if m.check(now) {
		t.Fatal("returned memory with no burst")
	}
	defer startBurst(2 * burstGoroutines)()
	if m.check(now.Add(time.Second)) {
		t.Fatal("returned memory while the burst was still rising")
	}
	// Garbage the burst left, and its pages: returned once it settled.
	leaveGarbage()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	if !m.check(now.Add(2 * time.Second)) {
		t.Fatalf("no return once the burst settled: low %d, now %d goroutines", m.low, runtime.NumGoroutine())
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if after.HeapReleased <= before.HeapReleased {
		t.Errorf("heap released %d → %d: nothing was returned", before.HeapReleased, after.HeapReleased)
	}
	if m.check(now.Add(3 * time.Second)) {
		t.Error("returned again within minReturnGap")
	}
}

// A burst that settles soon after the last return still gets its pages
// returned: minReturnGap bounds the returns after a burst ended, not the
// one of a burst that settled, so what waiting streams hold once settled
// does not depend on when the last return was. Not parallel: it counts
// the process's goroutines.
func TestMemReturnerSettledBurstNotHeldBackByGap(t *testing.T) {
	m := newMemReturner(testutil.DiscardLogger())
	now := time.Now()
	m.check(now)
	end := startBurst(2 * burstGoroutines)
	m.check(now.Add(time.Second))
	end()
	testutil.Eventually(t, 10*time.Second, func() bool {
		return runtime.NumGoroutine() < m.peak-burstGoroutines
	}, "the burst's goroutines did not end")
	if !m.check(now.Add(2 * time.Second)) {
		t.Fatal("no return after the first burst ended")
	}
	// A second burst rises and settles within minReturnGap of that return.
	defer startBurst(2 * burstGoroutines)()
	if m.check(now.Add(3 * time.Second)) {
		t.Fatal("returned memory while the second burst was still rising")
	}
	leaveGarbage()
	if !m.check(now.Add(4 * time.Second)) {
		t.Fatalf("the settled second burst was held back by minReturnGap: low %d, now %d goroutines", m.low, runtime.NumGoroutine())
	}
	if m.check(now.Add(5 * time.Second)) {
		t.Error("returned again with no new burst")
	}
}

// A ramp that stalled for an interval looks settled and gets a return;
// the rest of the ramp, less than a burst, gets another once it holds
// still, and a count that then holds still gets none. Not parallel: it
// counts the process's goroutines.
func TestMemReturnerStalledRampReturnedAgainAtItsEnd(t *testing.T) {
	m := newMemReturner(testutil.DiscardLogger())
	now := time.Now()
	m.check(now)
	defer startBurst(2 * burstGoroutines)()
	m.check(now.Add(time.Second))
	if !m.check(now.Add(2 * time.Second)) {
		t.Fatal("no return when the ramp stalled")
	}
	// The ramp goes on by half a burst, then holds still.
	defer startBurst(burstGoroutines / 2)()
	if m.check(now.Add(3 * time.Second)) {
		t.Fatal("returned memory while the ramp was still rising")
	}
	leaveGarbage()
	if !m.check(now.Add(4 * time.Second)) {
		t.Fatalf("the end of the ramp was not returned: low %d, last settled at %d, now %d goroutines", m.low, m.settledN, runtime.NumGoroutine())
	}
	if m.check(now.Add(5*time.Second)) || m.check(now.Add(6*time.Second)) {
		t.Error("returned again while the count held still")
	}
}

// startBurst starts n goroutines that wait; end stops them and returns
// once every one has.
func startBurst(n int) (end func()) {
	stop := make(chan struct{})
	done := make(chan struct{}, n)
	for range n {
		go func() {
			<-stop
			done <- struct{}{}
		}()
	}
	return func() {
		close(stop)
		for range n {
			<-done
		}
	}
}

// leaveGarbage allocates 16 MiB and drops it: garbage a burst leaves.
func leaveGarbage() {
	junk := make([][]byte, 0, 256)
	for range 256 {
		junk = append(junk, make([]byte, 64<<10))
	}
	runtime.KeepAlive(junk)
	_ = junk
}
