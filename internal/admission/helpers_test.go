package admission

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/metrics"
)

func newMetrics(tb testing.TB) *metrics.Metrics {
	tb.Helper()
	return metrics.New(prometheus.NewRegistry())
}

// fakeDepth is a depth function whose answer the test sets and whose
// calls it counts.
type fakeDepth struct {
	mu    sync.Mutex
	depth int64
	err   error
	calls atomic.Int64
}

func (f *fakeDepth) set(d int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.depth, f.err = d, err
}

func (f *fakeDepth) read(context.Context) (int64, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.depth, f.err
}

// fakeClock is an injected clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
