// Package testutil holds small helpers shared by tests, each with one
// meaning: Eventually (and Within) wait on a condition with a deadline
// (never a bare sleep), AdvanceFakeClock moves a testing/synctest bubble's clock, and
// DiscardLogger is the logger of tests that do not read logs.
package testutil

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
)

// Eventually waits until cond returns true, checking every millisecond, and
// fails the test if that takes longer than within.
func Eventually(tb testing.TB, within time.Duration, cond func() bool, what string) {
	tb.Helper()
	if !Within(within, cond) {
		tb.Fatalf("%s: not within %v", what, within)
	}
}

// Within waits until cond returns true, checking every millisecond, and
// reports whether it did within the deadline: for a test that says more
// than Eventually when the condition never comes.
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}

// AdvanceFakeClock moves the fake clock of the calling testing/synctest
// bubble forward by d: it waits until every other goroutine of the bubble
// is blocked, then sleeps d, which in a bubble takes no real time. The
// passing of time is then the thing under test. Outside a bubble it
// panics (synctest.Wait does), so it can never serve as a real sleep.
func AdvanceFakeClock(d time.Duration) {
	synctest.Wait()
	time.Sleep(d)
}

// LogBuffer collects log output from any goroutine, for tests that count
// log lines.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Count returns how many logged lines contain s.
func (b *LogBuffer) Count(s string) int {
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

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// NewLog returns a text logger at debug level writing into a LogBuffer.
func NewLog(tb testing.TB) (*slog.Logger, *LogBuffer) {
	tb.Helper()
	lb := &LogBuffer{}
	return slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})), lb
}

// DiscardLogger returns a logger that drops everything.
func DiscardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// HasBound reports whether err holds a *bounds.Error for field: a
// component's Validate found that field out of range.
func HasBound(err error, field string) bool {
	for _, e := range bounds.Errors(err) {
		if e.Field == field {
			return true
		}
	}
	return false
}
