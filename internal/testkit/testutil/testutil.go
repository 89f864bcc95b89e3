// Package testutil holds small helpers shared by tests, each with one
// meaning: Eventually (and Within) wait on a condition with a deadline
// (never a bare sleep), AdvanceFakeClock moves a testing/synctest bubble's clock, and
// DiscardLogger is the logger of tests that do not read logs.
package testutil

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"
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

// DiscardLogger returns a logger that drops everything.
func DiscardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
