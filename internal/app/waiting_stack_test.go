//go:build !race

package app

import (
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// A waiting stream parks: it takes its connection over from net/http, its
// handler returns, and the one goroutine left of it is the stream's own,
// whose stack a collection shrinks to 4 KiB; a heartbeat must not grow it
// back. Over HTTP/1.0 a stream cannot be taken over and waits under its
// handler, as every stream does for its first second: its frames must be
// few enough that a collection shrinks the handler's stack to 8 KiB. A
// stack only shrinks when less than a quarter of it (less the runtime's
// 800-byte allowance) is in use, so a frame added under the wait, or
// grown, puts every waiting stream back at 16 KiB (docs/bench-history/2026-11.md,
// "Waiting streams"). CORS is on: its middleware is one more frame under
// the handler's wait.
//
// Not under the race detector, whose instrumented frames and doubled
// stack guard make every stack deeper; not parallel, as it reads the
// process's stack total. That total also holds the rest of the process,
// and stacks are kept in spans of 32 KiB that go back to the heap only
// when every stack in them is free: a shrunk stream's old 16 KiB stack
// sharing a span with one still in use stays counted. Measured here
// (13 runs, quiet and loaded), a stream whose handler's stack shrank to
// 8 KiB shows 11,000–13,900 B under the handler; one whose frames keep it
// at 16 KiB shows 18,800 B. The limit lies between the two.
func TestWaitingStreamStacksShrink(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	const n = 200
	// Over HTTP/1.0 first, in the process as it started: the handler's
	// stacks then are what they would be in any api.
	url := startWaitingAPI(t, 2*n, map[string]string{"CORS_ALLOWED_ORIGINS": "https://chat.example.com"})

	held := openWaiting(t, url, n, "HTTP/1.0", "")
	t.Logf("under the handler, per stream: %.2f goroutines, %.0f B stack, %.0f B after a heartbeat",
		held.perStream(held.plateau.goroutines), held.perStream(held.plateau.stack), held.perStream(held.pinged.stack))
	// The handler's 8 KiB and net/http's reader's 2 KiB, and room for
	// the spans' fragmentation.
	const limit = 15 << 10
	if s := held.perStream(held.plateau.stack); s > limit {
		t.Errorf("%.0f bytes of stack per waiting stream after a collection, want at most %d: "+
			"the frames under the wait grew past what lets the handler's stack shrink to 8 KiB", s, limit)
	}
	if s := held.perStream(held.pinged.stack); s > limit {
		t.Errorf("%.0f bytes of stack per waiting stream after a heartbeat, want at most %d: "+
			"a heartbeat grows the handler's stack back", s, limit)
	}
	held.close()
	// Those streams see their clients leave and end; the next figures
	// are taken from where the process was before them.
	testutil.Eventually(t, 30*time.Second, func() bool {
		return memNow(false).goroutines <= held.before.goroutines+5
	}, "the held streams ended")

	parked := openWaiting(t, url, n, "HTTP/1.1", "")
	t.Logf("parked, per stream: %.2f goroutines, %.0f B stack, %.0f B heap",
		parked.perStream(parked.plateau.goroutines), parked.perStream(parked.plateau.stack), parked.perStream(parked.plateau.heap))
	if g := parked.perStream(parked.plateau.goroutines); g > 1.1 {
		t.Errorf("%.2f goroutines per parked stream, want 1: the stream did not take its connection "+
			"over from net/http, or its hang-up is watched by a goroutine", g)
	}
	const parkedLimit = 6 << 10 // 4 KiB, and the spans' fragmentation
	for _, m := range []struct {
		when  string
		stack uint64
	}{{"after a collection", parked.plateau.stack}, {"after a heartbeat", parked.pinged.stack}} {
		if s := parked.perStream(m.stack); s > parkedLimit {
			t.Errorf("%.0f bytes of stack per parked stream %s, want at most %d: the stream did not park, "+
				"or its goroutine's frames grew past what lets its stack shrink to 4 KiB", s, m.when, parkedLimit)
		}
	}
	parked.close()
}
