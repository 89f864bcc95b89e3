package stream

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
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

// gatedQueue is a Positioner whose every query blocks until the test lets
// it answer; the n-th query answers handed = n.
type gatedQueue struct {
	calls atomic.Int64
	gate  chan struct{}
}

func (g *gatedQueue) Progress(ctx context.Context) (int64, int64, error) {
	n := g.calls.Add(1)
	<-g.gate
	return n, 10, nil
}

// Reads arriving while a query runs share queries: the non-fresh ones the
// query in flight, the fresh ones (right after an enqueue) one query that
// starts once it ended, so each of them counts its own job; two queries
// for forty-one readers.
func TestProgressSharesQueries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		g := &gatedQueue{gate: make(chan struct{})}
		p := newProgress(g)
		results := make(chan [2]int64, 41) // {fresh, handed}
		read := func(fresh bool) {
			h, _, ok := p.read(fresh)
			if !ok {
				t.Errorf("read(%v) failed", fresh)
			}
			f := int64(0)
			if fresh {
				f = 1
			}
			results <- [2]int64{f, h}
		}
		go read(true) // leads the first query
		synctest.Wait()
		if n := g.calls.Load(); n != 1 {
			t.Fatalf("%d queries after the first read, want 1", n)
		}
		for range 20 {
			go read(true)
			go read(false)
		}
		synctest.Wait()
		if n := g.calls.Load(); n != 1 {
			t.Fatalf("%d queries while the first ran, want 1", n)
		}
		g.gate <- struct{}{} // the first query answers
		synctest.Wait()
		if n := g.calls.Load(); n != 2 {
			t.Fatalf("%d queries after the first answered, want 2 (the fresh reads' own)", n)
		}
		g.gate <- struct{}{}
		var fresh1, fresh2, stale1 int
		for range 41 {
			r := <-results
			switch {
			case r[0] == 1 && r[1] == 1:
				fresh1++
			case r[0] == 1 && r[1] == 2:
				fresh2++
			case r[0] == 0 && r[1] == 1:
				stale1++
			default:
				t.Errorf("read fresh=%d got the answer of query %d", r[0], r[1])
			}
		}
		if fresh1 != 1 || fresh2 != 20 || stale1 != 20 {
			t.Errorf("first query answered %d fresh and %d other reads, the second %d fresh; want 1, 20, 20", fresh1, stale1, fresh2)
		}
		// Within half a positionEvery a read that need not be fresh is
		// answered from the last counters, with no query.
		if h, _, ok := p.read(false); !ok || h != 2 || g.calls.Load() != 2 {
			t.Errorf("cached read = %d, %v after %d queries; want 2 from the cache", h, ok, g.calls.Load())
		}
	})
}

// A queued stream's headers go out with its first position, in one flush;
// when there is no position to tell, the headers still go out at once.
func TestQueuedHeadersGoWithTheFirstPosition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		queue   failover.Positioner
		flushes int
		writes  int
	}{
		{"position", &fakeQueue{handed: 5, waiting: 3}, 1, 1},
		{"no position", failingQueue{}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newTestHandler(t, time.Hour)
			h.progress = newProgress(tc.queue)
			w := &writeCounter{h: http.Header{}}
			frames := make(chan protocol.Result)
			s := h.newSession(w, "r", "u", protocol.PathQueued, time.Now())
			s.src.frames = frames
			s.position = &position{p: h.progress, sent: -1, ahead0: 2}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); s.serve(ctx) }()
			// The frames channel is unbuffered: once the pump took this
			// heartbeat, the start of the stream was written, and nothing
			// else until the next frame (the heartbeat timer waits an hour).
			frames <- protocol.Result{Kind: protocol.KindHeartbeat}
			flushes, writes, path := w.flushes, slices.Clone(w.writes), w.h.Get("X-Stream-Path")
			cancel()
			<-done
			if flushes != tc.flushes || len(writes) != tc.writes {
				t.Fatalf("%d flushes, %d writes %q; want the start in %d flush and %d write", flushes, len(writes), writes, tc.flushes, tc.writes)
			}
			if tc.writes > 0 && !strings.Contains(writes[0], "event: queued") {
				t.Fatalf("first write %q, want the queued event", writes[0])
			}
			if path != protocol.PathQueued {
				t.Fatalf("X-Stream-Path %q", path)
			}
		})
	}
}

// failingQueue is a Positioner that cannot tell.
type failingQueue struct{}

func (failingQueue) Progress(context.Context) (int64, int64, error) {
	return 0, 0, errors.New("no progress")
}
