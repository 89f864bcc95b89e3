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

// AdvanceFakeClock sleeps d. It exists for tests inside a testing/synctest
// bubble, where sleeping is how the fake clock moves forward; there the
// sleep is the thing under test, not a wait for a condition. Do not use it
// outside a bubble.
func AdvanceFakeClock(d time.Duration) {
	time.Sleep(d)
}
