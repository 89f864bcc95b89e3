package stream

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestChangedEnough(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		was, now int64
		want     bool
	}{
		{100, 100, false}, {100, 91, false}, {100, 90, true}, {100, 111, true}, {10, 9, true},
		{1, 0, true}, {0, 1, true}, {0, 0, false}, {1000, 901, false},
	} {
		if got := changedEnough(tt.was, tt.now); got != tt.want {
			t.Errorf("changedEnough(%d, %d) = %v, want %v", tt.was, tt.now, got, tt.want)
		}
	}
}

// fakeQueue is a Positioner whose counters the test moves.
type fakeQueue struct {
	mu              sync.Mutex
	handed, waiting int64
}

func (f *fakeQueue) Progress(context.Context) (int64, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handed, f.waiting, nil
}

func (f *fakeQueue) hand(n int64) {
	f.mu.Lock()
	f.handed += n
	f.waiting -= n
	f.mu.Unlock()
}

// A job enqueued behind 99 others is told 99, then a new position only
// once it moved by 10 % and a second passed; the ETA follows the drain.
func TestPositionEvents(t *testing.T) {
	t.Parallel()
	q := &fakeQueue{handed: 50, waiting: 100} // 99 ahead of ours
	h := &Handler{progress: newProgress(q)}
	ps := h.newPosition()
	t0 := time.Now()
	ev, ok := ps.next(t0)
	if !ok || ev.Position != 99 || ev.EtaSeconds != nil {
		t.Fatalf("first event %+v %v, want position 99 without an ETA", ev, ok)
	}
	q.hand(5)
	h.progress.at = time.Time{} // let the next read query
	if ev, ok := ps.next(t0.Add(2 * time.Second)); ok {
		t.Fatalf("5 %% change sent: %+v", ev)
	}
	q.hand(10)
	h.progress.mu.Lock()
	h.progress.at = time.Now().Add(-time.Second)
	h.progress.mu.Unlock()
	if ev, ok := ps.next(t0.Add(500 * time.Millisecond)); ok {
		t.Fatalf("sent within a second of the last: %+v", ev)
	}
	ev, ok = ps.next(t0.Add(3 * time.Second))
	if !ok || ev.Position != 84 || ev.EtaSeconds == nil || *ev.EtaSeconds < 1 {
		t.Fatalf("after 15 handed: %+v %v, want position 84 with an ETA", ev, ok)
	}
}
