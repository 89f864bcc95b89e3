package admission

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

type fakeSignals struct {
	mu sync.Mutex
	s  DegradeSignals
}

func (f *fakeSignals) Signals() DegradeSignals {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakeSignals) set(s DegradeSignals) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s = s
}

func TestLevelOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s    DegradeSignals
		want int
	}{
		{DegradeSignals{}, 0},
		{DegradeSignals{BacklogFraction: 0.09, QueueWaitP99: 4 * time.Second, ErrorRate: 0.04, HeapFraction: 0.69}, 0},
		{DegradeSignals{BacklogFraction: 0.10}, 1},
		{DegradeSignals{BacklogFraction: 0.50}, 2},
		{DegradeSignals{BacklogFraction: 0.80}, 3},
		{DegradeSignals{QueueWaitP99: 5 * time.Second}, 1},
		{DegradeSignals{QueueWaitP99: 15 * time.Second}, 2},
		{DegradeSignals{QueueWaitP99: 25 * time.Second}, 3},
		{DegradeSignals{ErrorRate: 0.05}, 1},
		{DegradeSignals{ErrorRate: 0.20}, 2},
		{DegradeSignals{ErrorRate: 0.50}, 3},
		{DegradeSignals{HeapFraction: 0.70}, 1},
		{DegradeSignals{HeapFraction: 0.80}, 2},
		{DegradeSignals{HeapFraction: 0.90}, 3},
		// The highest input wins.
		{DegradeSignals{BacklogFraction: 0.2, ErrorRate: 0.6}, 3},
	}
	for _, tt := range tests {
		if got := levelOf(tt.s); got != tt.want {
			t.Errorf("levelOf(%+v) = %d, want %d", tt.s, got, tt.want)
		}
	}
}

// Each level is entered at once and left only after DegradeHold below it,
// on the fake clock of testing/synctest.
func TestDegraderHysteresis(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		in := &fakeSignals{}
		d := NewDegrader(in)
		var mu sync.Mutex
		var gauge int
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go d.Run(ctx, func(l int) { mu.Lock(); gauge = l; mu.Unlock() })
		// after waits n seconds of fake time and returns the gauge.
		after := func(n int) int {
			time.Sleep(time.Duration(n)*time.Second + time.Millisecond)
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			return gauge
		}
		check := func(step string, got, want int) {
			t.Helper()
			if got != want {
				t.Fatalf("%s: level %d, want %d", step, got, want)
			}
		}
		check("idle", after(1), 0)
		for lvl, backlog := range []float64{0.1, 0.5, 0.8} {
			in.set(DegradeSignals{BacklogFraction: backlog})
			check("entering", after(1), lvl+1)
		}
		// Below level 3 (at level 1's signals): held at 3 for 30 s.
		in.set(DegradeSignals{ErrorRate: 0.06})
		check("just below 3", after(1), 3)
		check("below 3 for 28 s", after(27), 3)
		// A spike back to 3 restarts the hold.
		in.set(DegradeSignals{QueueWaitP99: 30 * time.Second})
		check("spike", after(1), 3)
		in.set(DegradeSignals{ErrorRate: 0.06})
		check("below again 29 s", after(29), 3)
		check("below 3 for the hold", after(2), 1)
		// Back to normal: level 1 is held too, then left.
		in.set(DegradeSignals{})
		check("below 1 for 10 s", after(10), 1)
		check("below 1 for the hold", after(21), 0)
		if d.Level() != 0 {
			t.Errorf("Level() = %d, want 0", d.Level())
		}
	})
}
