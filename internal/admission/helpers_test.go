package admission

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/metrics"
)

// logBuffer collects log output for tests that count log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many logged lines contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for line := range strings.Lines(b.buf.String()) {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLog(tb testing.TB) (*slog.Logger, *logBuffer) {
	tb.Helper()
	lb := &logBuffer{}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

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
