package upstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// line is the Balancer's waiting line: the calls of this process waiting
// in Acquire for an upstream slot, served in the order workers are given
// pool slots (docs/QUEUE.md, "Fairness"): round-robin between identities,
// oldest first within one. A waiter's turn is its identity's calls in
// flight from this process plus that identity's waiters older than it, so
// the identity holding fewest calls goes first, ties to the oldest
// waiter, as in the Redis pool's line.
//
// One goroutine (dispatchLoop) serves the line at every release or health
// change in the cluster, when a waiter joins, and at least every second.
// While the line holds waiters, new calls that do not wait (TryAcquire)
// leave the upstreams those waiters could use to them (wanted).
type line struct {
	mu      sync.Mutex
	waiters []*waiter      // oldest first
	inUse   map[string]int // calls in flight per identity, from this process
	seq     uint64

	wanted atomic.Uint64 // union of the waiters' want masks
	count  atomic.Int32  // len(waiters), read without the lock
	kick   chan struct{} // cap 1: a waiter joined
}

// waiter is one call waiting in Acquire.
type waiter struct {
	ctx  context.Context
	req  *protocol.ChatRequest
	a    ask
	seq  uint64
	want uint64       // upstreams serving its model that it has not tried
	got  chan granted // cap 1: its reservation, or why it stops waiting
	in   bool         // still in the line; under line.mu
}

type granted struct {
	r   *Reservation
	err error
}

func (l *line) init() {
	l.inUse = make(map[string]int)
	l.kick = make(chan struct{}, 1)
}

// held counts a reservation of identity taken (+1) or given back (-1).
func (l *line) held(identity string, d int) {
	if identity == "" {
		return
	}
	l.mu.Lock()
	if n := l.inUse[identity] + d; n > 0 {
		l.inUse[identity] = n
	} else {
		delete(l.inUse, identity)
	}
	l.mu.Unlock()
}

// join puts w in the line.
func (l *line) join(w *waiter) {
	l.mu.Lock()
	l.seq++
	w.seq, w.in = l.seq, true
	// Oldest first: by when the work was queued, then by arrival.
	i, _ := slices.BinarySearchFunc(l.waiters, w, olderFirst)
	l.waiters = slices.Insert(l.waiters, i, w)
	l.changedLocked()
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

func olderFirst(a, b *waiter) int {
	if c := a.a.since.Compare(b.a.since); c != 0 {
		return c
	}
	return cmp.Compare(a.seq, b.seq)
}

// leaveLocked takes w out of the line; false when it was out already.
func (l *line) leaveLocked(w *waiter) bool {
	if !w.in {
		return false
	}
	w.in = false
	l.waiters = slices.DeleteFunc(l.waiters, func(x *waiter) bool { return x == w })
	l.changedLocked()
	return true
}

func (l *line) changedLocked() {
	var m uint64
	for _, w := range l.waiters {
		m |= w.want
	}
	l.wanted.Store(m)
	l.count.Store(int32(len(l.waiters)))
}

// finish hands g to w and takes it out of the line; false when w left
// already (its context ended), and g.r is then the caller's to release.
func (l *line) finish(w *waiter, g granted) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leaveLocked(w) {
		return false
	}
	w.got <- g
	return true
}

// turnOrder returns the waiters in turn order, passing over those in skip.
func (l *line) turnOrder(skip map[*waiter]bool) []*waiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	type turn struct {
		w   *waiter
		key int
	}
	seen := make(map[string]int)
	order := make([]turn, 0, len(l.waiters))
	for _, w := range l.waiters {
		id := w.a.identity
		key := l.inUse[id] + seen[id]
		seen[id]++
		if !skip[w] {
			order = append(order, turn{w, key})
		}
	}
	// Stable: equal turns stay oldest first.
	slices.SortStableFunc(order, func(a, b turn) int { return cmp.Compare(a.key, b.key) })
	out := make([]*waiter, len(order))
	for i, t := range order {
		out[i] = t.w
	}
	return out
}

// acquire reserves a slot for req, waiting in the line while no upstream
// can take it. With nobody waiting it first tries at once, like a call
// that does not wait.
func (b *Balancer) acquire(ctx context.Context, req *protocol.ChatRequest, a ask) (*Reservation, error) {
	if b.line.count.Load() == 0 {
		r, err := b.reserve(ctx, req, a, 0)
		if err == nil {
			r.wait = true
			return r, nil
		}
		if !b.worthWaiting(err, req.Model, a.tried) {
			return nil, err
		}
	}
	if a.since.IsZero() {
		a.since = time.Now() // its place in line: when it started waiting
	}
	w := &waiter{ctx: ctx, req: req, a: a, want: b.wants(req.Model, a.tried), got: make(chan granted, 1)}
	b.line.join(w)
	select {
	case g := <-w.got:
		return g.r, g.err
	case <-ctx.Done():
		b.line.mu.Lock()
		left := b.line.leaveLocked(w)
		b.line.mu.Unlock()
		if !left {
			// Served as it gave up: give the slot back.
			if g := <-w.got; g.r != nil {
				g.r.Release()
			}
		}
		return nil, fmt.Errorf("upstream: wait for an upstream: %w", ctx.Err())
	}
}

// worthWaiting reports whether a failed reservation should wait: every
// upstream is only full, out of quota or sitting out, and, for a retry, an
// untried one is still up.
func (b *Balancer) worthWaiting(err error, model string, tried uint64) bool {
	return errors.Is(err, ErrNoUpstream) && (tried == 0 || b.anyUp(model, tried))
}

// wants returns the upstreams serving model that are not in tried.
func (b *Balancer) wants(model string, tried uint64) uint64 {
	var m uint64
	for i, u := range b.ups {
		if tried&(1<<i) == 0 && u.Spec.Serves(model) {
			m |= 1 << i
		}
	}
	return m
}

// dispatchLoop serves the line until ctx ends.
func (b *Balancer) dispatchLoop(ctx context.Context) {
	defer b.done.Done()
	t := time.NewTicker(recheckEvery)
	defer t.Stop()
	for {
		// Taken before serving, so a change while serving is not missed.
		capsCh, healthCh := b.caps.Changed(), b.health.Changed()
		if b.line.count.Load() > 0 {
			b.dispatch()
		}
		select {
		case <-ctx.Done():
			return
		case <-b.line.kick:
		case <-capsCh:
		case <-healthCh:
		case <-t.C:
		}
	}
}

// dispatch offers what is free to the waiters in turn order: each one in
// turn tries to reserve; the first to succeed is served and the order is
// taken again (its identity now holds one more call). A waiter that finds
// nothing keeps its place and is not tried again this round; one that can
// no longer be served (unknown model, every circuit open, its context
// ended, nothing untried is up for a retry) is told why.
func (b *Balancer) dispatch() {
	tried := make(map[*waiter]bool)
	for {
		served := false
		for _, w := range b.line.turnOrder(tried) {
			r, err := b.reserve(w.ctx, w.req, w.a, 0)
			if err == nil {
				r.wait = true
				if !b.line.finish(w, granted{r: r}) {
					r.Release()
				}
				served = true
				break
			}
			tried[w] = true
			if !b.worthWaiting(err, w.req.Model, w.a.tried) || w.ctx.Err() != nil {
				b.line.finish(w, granted{err: err})
			}
		}
		if !served {
			return
		}
	}
}
