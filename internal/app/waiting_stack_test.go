//go:build !race

package app

import "testing"

// A waiting stream's handler goroutine blocks with few enough bytes of
// frames under it that a collection shrinks its stack to 8 KiB: a stack
// only shrinks when less than a quarter of it (less the runtime's 800-byte
// allowance) is in use, so a frame added under the wait, or grown, puts
// every waiting stream back at 16 KiB (docs/BENCHMARKS.md, "Waiting
// streams"). 16 KiB fails the test; 8 passes. CORS is on: its middleware
// is one more frame under the wait. A heartbeat must not grow the stack
// back either. The stream has taken its connection over from net/http,
// so its handler's is the one goroutine left of it.
//
// Not under the race detector, whose instrumented frames and doubled
// stack guard make every stack deeper; not parallel, as it reads the
// process's stack total.
func TestWaitingStreamStacksShrink(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	const n = 200
	url := startWaitingAPI(t, n, map[string]string{"CORS_ALLOWED_ORIGINS": "https://chat.example.com"})
	w := openWaiting(t, url, n, "")
	defer w.close()
	const limit = 12 << 10
	if g := w.perStream(w.plateau.goroutines); g > 1.1 {
		t.Errorf("%.2f goroutines per waiting stream, want 1: the stream did not take its connection "+
			"over from net/http, or its hang-up is watched by a goroutine", g)
	}
	t.Logf("per waiting stream: %.2f goroutines, %.0f B stack, %.0f B heap",
		w.perStream(w.plateau.goroutines), w.perStream(w.plateau.stack), w.perStream(w.plateau.heap))
	if s := w.perStream(w.plateau.stack); s > limit {
		t.Errorf("%.0f bytes of stack per waiting stream after a collection, want at most %d: "+
			"the frames under the wait grew past what lets the handler's stack shrink to 8 KiB", s, limit)
	}
	if s := w.perStream(w.pinged.stack); s > limit {
		t.Errorf("%.0f bytes of stack per waiting stream after a heartbeat, want at most %d: "+
			"a heartbeat grows the handler's stack back", s, limit)
	}
}
