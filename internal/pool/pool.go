// Package pool owns the concurrency slots that bound calls to the provider:
// a global limit and a per-user limit, with a local backend and a
// Redis-backed distributed one.
package pool

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors of TryAcquire and Acquire.
var (
	// ErrPoolExhausted means every global slot is taken.
	ErrPoolExhausted = errors.New("pool: all slots in use")
	// ErrUserLimit means the user holds CONNECTION_POOL_PER_USER slots already.
	ErrUserLimit = errors.New("pool: per-user limit reached")
)

// DefaultPerUser is CONNECTION_POOL_PER_USER's default: the slots one
// identity may hold at once, on either backend.
const DefaultPerUser = 5

// Lease is one held slot. Release is idempotent and safe to call from any
// goroutine; after the first call it does nothing.
type Lease interface {
	Release()
}

// Pool hands out slots. Implementations are safe for concurrent use.
//
// A user is an identity (internal/identity); the per-user limit counts its
// identity.Bucket, so the users of one API key share their key's slots.
//
// TryAcquire never waits: it returns a lease, or an error wrapping
// ErrPoolExhausted or ErrUserLimit. Acquire waits until a slot is free or ctx
// ends (then it returns an error wrapping ctx.Err()).
type Pool interface {
	TryAcquire(ctx context.Context, user string) (Lease, error)
	Acquire(ctx context.Context, user string) (Lease, error)
	Stats() Stats
}

// Stats is a snapshot of the pool for metrics.
type Stats struct {
	InUse    int
	Capacity int
	// Limit is how many slots may be in use now: Capacity, or fewer while
	// adaptive concurrency holds the limit down (docs/OPERATIONS.md,
	// "Adaptive concurrency"). 0 means Capacity, for a pool that does not
	// adapt; read it with Effective.
	Limit int
}

// Effective returns the slots that may be in use now: Limit when set and
// below Capacity, else Capacity.
func (s Stats) Effective() int {
	if s.Limit > 0 && s.Limit < s.Capacity {
		return s.Limit
	}
	return s.Capacity
}

// Queued is a Pool that can order waiters by when their work was queued
// rather than by when they called. Workers pass the job's enqueue time, so
// jobs get slots in queue order whatever order the worker goroutines (or
// worker processes) reach the pool.
type Queued interface {
	AcquireSince(ctx context.Context, user string, since time.Time) (Lease, error)
}

// Deferrer is a Pool that can turn a waiter away while its user is at the
// per-user limit instead of keeping it in line for that user's next slot.
// Workers use it so that a job whose user has no room does not hold a
// worker slot (docs/QUEUE.md, "Fairness"): it is set aside and the worker
// takes a job of another identity.
//
// AcquireOrDefer waits like AcquireSince, but only for a global slot: it
// returns an error wrapping ErrUserLimit at once when user holds its
// per-user limit, and as soon as that happens while it waits.
type Deferrer interface {
	AcquireOrDefer(ctx context.Context, user string, since time.Time) (Lease, error)
}
