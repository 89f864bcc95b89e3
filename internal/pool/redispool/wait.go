package redispool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/rediserr"
)

// errModeChanged tells Acquire to start over on the other backend.
var errModeChanged = errors.New("redispool: backend changed")

// waiter is one Acquire call waiting in Redis.
type waiter struct {
	user   string
	member string // "<16 hex id>:<user>", its entry in WaitersKey
	seq    uint64 // arrival order in this process
	since  int64  // place in line: when its work was queued (µs since the epoch)
	ready  chan result
	// deferring: turned away with pool.ErrUserLimit instead of waiting
	// while its user is at the per-user limit (AcquireOrDefer).
	deferring bool

	// Guarded by Pool.mu.
	registered bool  // Redis has (or may have) the entry
	enqueued   int64 // its score there, once registered
	inflight   bool  // the dispatcher is running a script for it
	gone       bool  // it gave up; whoever finishes with it cleans up
}

type result struct {
	lease pool.Lease
	err   error
}

// acquireLocal waits in the fallback pool until a slot, ctx's end, or the
// next backend switch (errModeChanged).
func (p *Pool) acquireLocal(ctx context.Context, user string, since time.Time, deferring bool, changed <-chan struct{}) (pool.Lease, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-changed:
			cancel()
		case <-p.closing:
			cancel()
		case <-lctx.Done():
		}
	}()
	var l pool.Lease
	var err error
	if deferring {
		l, err = p.local.AcquireOrDefer(lctx, user, since)
	} else {
		l, err = p.local.AcquireSince(lctx, user, since)
	}
	cancel()
	<-done
	if errors.Is(err, pool.ErrUserLimit) {
		return nil, err
	}
	if err != nil && ctx.Err() == nil {
		if p.isClosed() {
			return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ErrClosed)
		}
		return nil, errModeChanged
	}
	return l, err
}

// acquireRedis waits in Redis until a slot, ctx's end, Close, or the next
// backend switch (errModeChanged).
func (p *Pool) acquireRedis(ctx context.Context, user string, since int64, deferring bool, changed <-chan struct{}) (pool.Lease, error) {
	p.mu.Lock()
	queued := len(p.waiters) > 0
	p.mu.Unlock()
	if !queued || deferring {
		// Like a direct request: granted only when no waiter is deprived,
		// and like one it may take an idle lease of its user, and its own
		// lease may go idle when released (idle.go): a worker's next job
		// then starts without a Redis call.
		if !queued && p.cfg.IdleHold > 0 {
			if l := p.takeIdle(user); l != nil {
				return l, nil
			}
		}
		l, err := p.acquireBlock(ctx, user)
		var ue *unavailableError
		var se *slowError
		switch {
		case err == nil:
			return l, nil
		case deferring && errors.Is(err, pool.ErrUserLimit):
			return nil, err
		case errors.As(err, &ue):
			p.setFallback(true, err)
			return nil, errModeChanged
		case errors.As(err, &se):
			p.suspect(err) // busy, not gone: wait in line like the others
		case !errors.Is(err, pool.ErrPoolExhausted) && !errors.Is(err, pool.ErrUserLimit):
			return nil, err
		}
	}

	w := &waiter{user: user, member: newID() + ":" + user, since: since, deferring: deferring, ready: make(chan result, 1)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ErrClosed)
	}
	p.seq++
	w.seq = p.seq
	// Keep the local line in order of place: behind every waiter queued no
	// later than w.
	i := len(p.waiters)
	for i > 0 && p.waiters[i-1].since > since {
		i--
	}
	p.waiters = slices.Insert(p.waiters, i, w)
	if !p.dispatching {
		p.dispatching = p.goLocked(p.dispatch)
	}
	p.mu.Unlock()
	p.kickDispatch()

	select {
	case r := <-w.ready:
		return r.lease, r.err
	case <-ctx.Done():
	case <-changed:
	case <-p.closing:
	}
	if r, ok := p.withdraw(w); ok {
		if r.err == nil && ctx.Err() != nil {
			// Granted as we gave up: the caller is gone, hand it back.
			r.lease.Release()
			return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ctx.Err())
		}
		return r.lease, r.err
	}
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ctx.Err())
	case p.isClosed():
		return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ErrClosed)
	default:
		return nil, errModeChanged
	}
}

// withdraw takes w out of the queue, or returns the result it was given
// meanwhile.
func (p *Pool) withdraw(w *waiter) (result, bool) {
	p.mu.Lock()
	select {
	case r := <-w.ready:
		p.mu.Unlock()
		return r, true
	default:
	}
	if w.gone { // Close took it
		p.mu.Unlock()
		return result{}, false
	}
	w.gone = true
	p.waiters = slices.DeleteFunc(p.waiters, func(x *waiter) bool { return x == w })
	// With a script in flight the dispatcher withdraws it when done.
	leave := w.registered && !w.inflight
	p.mu.Unlock()
	if leave {
		p.leave(w.member)
	}
	return result{}, false
}

// leave withdraws a waiter from Redis. While Redis is away the entry is
// kept for the renewal loop to withdraw once Redis answers again: left
// behind, it would hold free slots back from direct requests for up to
// LeaseTTL after the outage.
func (p *Pool) leave(member string) {
	if fb, _ := p.mode(); !fb {
		err := p.runLeave(context.Background(), member)
		var ue *unavailableError
		var se *slowError
		switch {
		case errors.As(err, &ue):
			p.setFallback(true, err)
		case errors.As(err, &se):
			p.suspect(err) // kept for the next renewal round
		default:
			return // done, or an error reply: the entry expires by itself
		}
	}
	p.mu.Lock()
	p.orphans = append(p.orphans, member)
	p.mu.Unlock()
	// Redis may have come back between the mode check and now, after the
	// return's renewal ran: make sure a renewal withdraws this one soon.
	if fb, _ := p.mode(); !fb {
		p.kickRenew()
	}
}

// kickRenew asks the renewal loop for a round now.
func (p *Pool) kickRenew() {
	select {
	case p.statsKick <- struct{}{}:
	default:
	}
}

func (p *Pool) kickDispatch() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// dispatch is the goroutine that hands slots to this process's waiters.
// It subscribes to NotifyChannel before its first pass, so a release after
// a waiter registered is never missed while the subscription holds; the
// ticker covers the rest.
func (p *Pool) dispatch() {
	var ps *redis.PubSub
	var msgs <-chan any
	defer func() {
		if ps != nil {
			_ = ps.Close()
		}
	}()
	tick := time.NewTicker(p.recheck)
	defer tick.Stop()
	resubscribe := true // at start, then on the ticker while unsubscribed
	for {
		if ps == nil && resubscribe {
			ps, msgs = p.subscribe()
		}
		resubscribe = false
		p.pass()
		select {
		case <-p.closing:
			return
		case <-p.kick:
		case <-tick.C:
			resubscribe = true
		case _, ok := <-msgs:
			if !ok {
				ps, msgs = nil, nil
				continue
			}
			// One pass serves a burst of notifications.
			for drained := false; !drained; {
				select {
				case <-msgs:
				default:
					drained = true
				}
			}
		}
	}
}

// subscribe returns a confirmed subscription to NotifyChannel, or nils.
// Messages include *redis.Subscription after go-redis reconnects, which
// triggers a pass too: notifications may have been lost meanwhile.
func (p *Pool) subscribe() (*redis.PubSub, <-chan any) {
	if fb, _ := p.mode(); fb {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	ps := p.rdb.Subscribe(ctx, p.channel)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		err = fmt.Errorf("redispool: subscribe %s: %w", p.channel, err)
		switch rediserr.Classify(err) {
		case rediserr.Gone:
			p.setFallback(true, err)
		case rediserr.Busy:
			p.suspect(err) // the ticker subscribes again
		default:
			p.log.Warn("redispool: subscribe failed; waiters are served by the 1s re-check only", "error", err)
		}
		return nil, nil
	}
	return ps, ps.ChannelWithSubscriptions()
}

// pass tries this process's waiters, oldest first, in block.lua calls of
// up to maxBlock waiters each: one call for the whole line, not one per
// waiter. A refusal for lack of slots does not end it: in round-robin
// order (block.lua) a younger waiter of a user holding fewer slots may
// come first. Waiters not yet registered are tried too, which registers
// them.
func (p *Pool) pass() {
	if fb, _ := p.mode(); fb {
		return
	}
	p.mu.Lock()
	ws := slices.Clone(p.waiters)
	slices.SortStableFunc(ws, func(a, b *waiter) int {
		// Redis order (score, then member) for registered waiters; the
		// others register behind them in arrival order.
		switch {
		case a.registered != b.registered:
			if a.registered {
				return -1
			}
			return 1
		case a.registered:
			return cmp.Or(cmp.Compare(a.enqueued, b.enqueued), cmp.Compare(a.member, b.member))
		default:
			return cmp.Compare(a.seq, b.seq)
		}
	})
	p.mu.Unlock()

	for len(ws) > 0 {
		select {
		case <-p.closing:
			return
		default:
		}
		n := min(len(ws), maxBlock)
		if !p.tryWaiters(ws[:n]) {
			return
		}
		ws = ws[n:]
	}
}

// tryWaiters makes one block.lua call for the waiters of ws still waiting
// and hands out what it granted. It reports false when the pass should
// stop: Redis gone or slow.
func (p *Pool) tryWaiters(ws []*waiter) bool {
	p.mu.Lock()
	tried := make([]*waiter, 0, len(ws))
	tries := make([]waitTry, 0, len(ws))
	for _, w := range ws {
		if w.gone {
			continue
		}
		w.inflight = true
		tried = append(tried, w)
		tries = append(tries, waitTry{user: w.user, id: p.newLeaseID(), member: w.member, since: w.since, deferring: w.deferring})
	}
	p.mu.Unlock()
	if len(tried) == 0 {
		return true
	}

	rep, err := p.runWaiters(context.Background(), tries)

	var ue *unavailableError
	var se *slowError
	p.mu.Lock()
	for _, w := range tried {
		w.inflight = false
	}
	switch {
	case errors.As(err, &ue):
		// The script may have run: withdrawing must try to remove them.
		for _, w := range tried {
			w.registered = true
		}
		p.mu.Unlock()
		p.setFallback(true, err) // the waiters move to the fallback pool
		return false
	case errors.As(err, &se):
		// Busy, not gone. The script may still run: what it registered
		// is withdrawn by renewal (runWaiters), so each waiter goes on
		// under a new member, in the same place (since); an entry
		// registered by an earlier pass is withdrawn by renewal too.
		for _, w := range tried {
			if w.registered {
				p.orphans = append(p.orphans, w.member)
			}
			if !w.gone {
				w.member = newID() + ":" + w.user
			}
			w.registered, w.enqueued = false, 0
		}
		p.startRenewalLocked()
		p.mu.Unlock()
		p.suspect(err)
		return false // the next pass (release or re-check) tries again
	}

	// What to do for waiters that gave up while the call was out.
	var toRelease []pool.Lease
	var toLeave []string
	for j, w := range tried {
		var res *result
		withdrawn := false // no entry left in Redis
		switch {
		case err != nil:
			res = &result{err: err}
		case rep.waiters[j].code == codeGranted:
			w.registered = false
			withdrawn = true
			res = &result{lease: p.grantLocked(tries[j].id, w.user)}
		case rep.waiters[j].code == codeUserLimit && w.deferring:
			// Turned away and withdrawn by the script, so a job that
			// cannot start holds nothing back.
			w.registered = false
			withdrawn = true
			res = &result{err: fmt.Errorf("redispool: acquire for %s: %w", w.user, pool.ErrUserLimit)}
		default:
			w.registered, w.enqueued = true, rep.waiters[j].enqueued
			p.startRenewalLocked() // keeps the registration alive
		}
		switch {
		case !w.gone:
			if res != nil {
				p.waiters = slices.DeleteFunc(p.waiters, func(x *waiter) bool { return x == w })
				w.ready <- *res
			}
		case res != nil && res.lease != nil:
			toRelease = append(toRelease, res.lease)
		case err == nil && !withdrawn:
			toLeave = append(toLeave, w.member)
		}
	}
	p.mu.Unlock()
	for _, l := range toRelease {
		l.Release()
	}
	for _, m := range toLeave {
		p.leave(m)
	}
	return true
}
