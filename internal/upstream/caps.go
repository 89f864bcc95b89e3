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
// MaxConcurrency. Implementations are safe for concurrent use.
//
// TryAcquire never waits: it returns a slot, or an error wrapping ErrFull,
// or ctx's error. Release gives a slot back exactly once; it does not
// take a context because it must run even after the request's ended (it
// bounds its own I/O). Load returns the upstream's calls in flight as last
// learnt, without I/O. Changed returns a channel closed at the next
// release (anywhere in the cluster, best effort): workers wait on it.
type Caps interface {
	TryAcquire(ctx context.Context, i int) (Slot, error)
	Release(s Slot)
	Load(i int) int
	Changed() <-chan struct{}
}

// LocalCaps are in-process caps: one atomic counter per upstream. They
// serve embedded mode and the local pool backend, and are the fallback of
// RedisCaps while Redis is away.
type LocalCaps struct {
	limits []int64
	n      []atomic.Int64
	change notifier
}

var _ Caps = (*LocalCaps)(nil)

// NewLocalCaps returns caps for specs; an upstream whose MaxConcurrency is
// 0 is never full.
func NewLocalCaps(specs []Spec) *LocalCaps {
	c := &LocalCaps{limits: make([]int64, len(specs)), n: make([]atomic.Int64, len(specs))}
	for i, s := range specs {
		c.limits[i] = int64(s.MaxConcurrency)
	}
	return c
}

// TryAcquire takes a slot of upstream i when it has one free.
func (c *LocalCaps) TryAcquire(ctx context.Context, i int) (Slot, error) {
	if err := ctx.Err(); err != nil {
		return Slot{}, err
	}
	for {
		cur := c.n[i].Load()
		if c.limits[i] > 0 && cur >= c.limits[i] {
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

// Changed returns a channel closed at the next Release.
func (c *LocalCaps) Changed() <-chan struct{} { return c.change.wait() }
