// Package testutil holds small helpers shared by tests: waiting on a
// condition with a deadline instead of sleeping.
package testutil

import (
	"testing"
	"time"
)

// Eventually waits until cond returns true, checking every millisecond, and
// fails the test if that takes longer than within.
func Eventually(tb testing.TB, within time.Duration, cond func() bool, what string) {
	tb.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			tb.Fatalf("%s: not within %v", what, within)
		case <-tick.C:
		}
	}
}
