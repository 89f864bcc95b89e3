package upstream

import (
	"context"
	"errors"
	"sync/atomic"
)

// ErrFull means an upstream has max_concurrency calls in flight.
var ErrFull = errors.New("upstream: at its concurrency cap")

// Slot is one held call slot of a capped upstream, returned by
// Caps.TryAcquire and given back with Caps.Release.
type Slot struct {
	index int
	id    string // lease id in Redis; empty for an in-process slot
}

// Caps counts the calls in flight on each capped upstream (index i of the
// Spec list the implementation was built with) and holds them under its
// limit: its MaxConcurrency, or lower while adaptive concurrency has
// lowered it (SetLimit). Implementations are safe for concurrent use.
//
// TryAcquire never waits: it returns a slot, or an error wrapping ErrFull,
// or ctx's error. Release gives a slot back exactly once; it does not
// take a context because it must run even after the request's ended (it
// bounds its own I/O). Load returns the upstream's calls in flight as last
// learnt, without I/O. Limit returns upstream i's limit now (0: none).
// Changed returns a channel closed at the next release (anywhere in the
// cluster, best effort) or raised limit: workers wait on it.
type Caps interface {
	TryAcquire(ctx context.Context, i int) (Slot, error)
	Release(s Slot)
	Load(i int) int
	Limit(i int) int
	Changed() <-chan struct{}
}

// limits are the caps' limit per upstream: MaxConcurrency, lowered by
// SetLimit while adaptive concurrency has lowered it.
type limits struct {
	max []int64 // MaxConcurrency; 0: none
	now []atomic.Int64
}

func newLimits(specs []Spec) limits {
	l := limits{max: make([]int64, len(specs)), now: make([]atomic.Int64, len(specs))}
	for i, s := range specs {
		l.max[i] = int64(s.MaxConcurrency)
		l.now[i].Store(l.max[i])
	}
	return l
}

// Limit returns upstream i's limit (0: none).
func (l *limits) Limit(i int) int { return int(l.now[i].Load()) }

// set makes upstream i's limit n, between 1 and its MaxConcurrency, and
// reports whether it rose. An upstream without a MaxConcurrency keeps
// none: its calls are bounded by the global pool alone.
func (l *limits) set(i, n int) bool {
	if l.max[i] == 0 {
		return false
	}
	v := min(max(int64(n), 1), l.max[i])
	return l.now[i].Swap(v) < v
}

// LocalCaps are in-process caps: one atomic counter per upstream. They
// serve embedded mode and the local pool backend, and are the fallback of
// RedisCaps while Redis is away.
type LocalCaps struct {
	limits
	n      []atomic.Int64
	change notifier
}

var _ Caps = (*LocalCaps)(nil)

// NewLocalCaps returns caps for specs; an upstream whose MaxConcurrency is
// 0 is never full.
func NewLocalCaps(specs []Spec) *LocalCaps {
	return &LocalCaps{limits: newLimits(specs), n: make([]atomic.Int64, len(specs))}
}

// TryAcquire takes a slot of upstream i when it has one free.
func (c *LocalCaps) TryAcquire(ctx context.Context, i int) (Slot, error) {
	if err := ctx.Err(); err != nil {
		return Slot{}, err
	}
	for {
		cur := c.n[i].Load()
		if limit := c.now[i].Load(); limit > 0 && cur >= limit {
			return Slot{}, ErrFull
		}
		if c.n[i].CompareAndSwap(cur, cur+1) {
			return Slot{index: i}, nil
		}
	}
}

// Release gives s back and wakes waiters.
func (c *LocalCaps) Release(s Slot) {
	c.n[s.index].Add(-1)
	c.change.notify()
}

// Load returns the calls in flight on upstream i.
func (c *LocalCaps) Load(i int) int { return int(c.n[i].Load()) }

// SetLimit makes upstream i's limit n (adaptive concurrency), within 1
// and its MaxConcurrency; calls already in flight above it finish. A
// raised limit wakes waiters.
func (c *LocalCaps) SetLimit(i, n int) {
	if c.set(i, n) {
		c.change.notify()
	}
}

// Changed returns a channel closed at the next Release or raised limit.
func (c *LocalCaps) Changed() <-chan struct{} { return c.change.wait() }
