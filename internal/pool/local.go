package pool

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/identity"
)

// Local is an in-process Pool. Waiters are served in arrival order: a freed
// slot goes to the oldest waiter that fits (global and per-user limits)
// before any later TryAcquire can take it, so queued jobs are not starved
// by newer direct requests.
type Local struct {
	size, perUser int

	mu      sync.Mutex
	limit   int // slots that may be in use: size, or less (SetLimit)
	inUse   int
	users   map[string]int
	waiters list.List // of *waiter, oldest first
}

type waiter struct {
	user  string
	since time.Time // place in line
	// deferring waiters are turned away with ErrUserLimit instead of
	// waiting while their user is at the per-user limit.
	deferring bool
	ready     chan grant // buffered 1; receives the lease or the refusal
}

type grant struct {
	lease *localLease
	err   error
}

var (
	_ Pool     = (*Local)(nil)
	_ Queued   = (*Local)(nil)
	_ Deferrer = (*Local)(nil)
)

// NewLocal returns a pool of size global slots and perUser slots per user.
func NewLocal(size, perUser int) (*Local, error) {
	if size < 1 || perUser < 1 {
		return nil, fmt.Errorf("pool: size (%d) and per-user limit (%d) must be at least 1", size, perUser)
	}
	return &Local{size: size, perUser: perUser, limit: size, users: make(map[string]int)}, nil
}

// SetLimit lowers how many slots may be in use to n (at least 1, at most
// the size), or raises it back, for adaptive concurrency. Leases held
// above a lowered limit stay valid; no new one is granted until the count
// is below it. Raising it serves waiters at once.
func (p *Local) SetLimit(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limit = min(max(n, 1), p.size)
	p.serveLocked()
}

// TryAcquire takes a slot if one is free for user, without waiting.
func (p *Local) TryAcquire(_ context.Context, user string) (Lease, error) {
	user = identity.Bucket(user)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.fitsLocked(user); err != nil {
		return nil, err
	}
	return p.grantLocked(user), nil
}

// Acquire waits for a slot for user, in FIFO order among waiters, until
// ctx ends.
func (p *Local) Acquire(ctx context.Context, user string) (Lease, error) {
	return p.AcquireSince(ctx, user, time.Now())
}

// AcquireSince is Acquire with the waiter placed in line by since (when
// its work was queued) instead of by arrival.
func (p *Local) AcquireSince(ctx context.Context, user string, since time.Time) (Lease, error) {
	return p.acquire(ctx, user, since, false)
}

// AcquireOrDefer is AcquireSince that waits only for a global slot: while
// user is at its per-user limit it returns an error wrapping ErrUserLimit.
func (p *Local) AcquireOrDefer(ctx context.Context, user string, since time.Time) (Lease, error) {
	return p.acquire(ctx, user, since, true)
}

func (p *Local) acquire(ctx context.Context, user string, since time.Time, deferring bool) (Lease, error) {
	user = identity.Bucket(user)
	p.mu.Lock()
	// Any waiter that fitted was granted when capacity freed, so the ones
	// left wait on their own per-user limit: a fitting caller may go first.
	err := p.fitsLocked(user)
	if err == nil {
		l := p.grantLocked(user)
		p.mu.Unlock()
		return l, nil
	}
	if deferring && errors.Is(err, ErrUserLimit) {
		p.mu.Unlock()
		return nil, fmt.Errorf("pool: acquire for %s: %w", user, err)
	}
	w := &waiter{user: user, since: since, deferring: deferring, ready: make(chan grant, 1)}
	// Behind every waiter queued no later than it.
	var elem *list.Element
	for e := p.waiters.Back(); e != nil; e = e.Prev() {
		if !e.Value.(*waiter).since.After(since) {
			elem = p.waiters.InsertAfter(w, e)
			break
		}
	}
	if elem == nil {
		elem = p.waiters.PushFront(w)
	}
	p.mu.Unlock()

	select {
	case g := <-w.ready:
		if g.err != nil {
			return nil, g.err
		}
		return g.lease, nil
	case <-ctx.Done():
		p.mu.Lock()
		select {
		case g := <-w.ready:
			// Granted while we were giving up: hand it back.
			p.mu.Unlock()
			if g.lease != nil {
				g.lease.Release()
			}
		default:
			p.waiters.Remove(elem)
			p.mu.Unlock()
		}
		return nil, fmt.Errorf("pool: acquire for %s: %w", user, ctx.Err())
	}
}

// Stats returns slots in use and capacity.
func (p *Local) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{InUse: p.inUse, Capacity: p.size, Limit: p.limit}
}

// Waiting returns how many Acquire calls are waiting.
func (p *Local) Waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waiters.Len()
}

func (p *Local) fitsLocked(user string) error {
	if p.inUse >= p.limit {
		return ErrPoolExhausted
	}
	if p.users[user] >= p.perUser {
		return ErrUserLimit
	}
	return nil
}

func (p *Local) grantLocked(user string) *localLease {
	p.inUse++
	p.users[user]++
	return &localLease{pool: p, user: user}
}

func (p *Local) release(user string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inUse--
	if p.users[user]--; p.users[user] <= 0 {
		delete(p.users, user)
	}
	p.serveLocked()
}

// serveLocked hands free capacity to the oldest waiters that fit, and
// turns deferring waiters whose user has no room away, so they hold
// nothing.
func (p *Local) serveLocked() {
	for e := p.waiters.Front(); e != nil && p.inUse < p.limit; {
		next := e.Next()
		w := e.Value.(*waiter)
		switch {
		case p.users[w.user] < p.perUser:
			p.waiters.Remove(e)
			w.ready <- grant{lease: p.grantLocked(w.user)}
		case w.deferring:
			p.waiters.Remove(e)
			w.ready <- grant{err: fmt.Errorf("pool: acquire for %s: %w", w.user, ErrUserLimit)}
		}
		e = next
	}
}

type localLease struct {
	pool *Local
	user string
	once sync.Once
}

func (l *localLease) Release() {
	l.once.Do(func() { l.pool.release(l.user) })
}
