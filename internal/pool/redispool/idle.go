package redispool

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/rediserr"
)

// Idle leases (docs/OPERATIONS.md, "Idle leases"). A direct lease
// (TryAcquire) released by its holder is not given back to Redis at once:
// it stays a lease of this process, idle, for Config.IdleHold, and the
// next TryAcquire of the same user in this process takes it without a
// Redis call. It stays a real lease all along — counted in LeasesKey and
// the user's set, renewed with the others — so the cluster never holds
// more than Size slots, or a user more than PerUser: the cache is exact by
// construction. What it costs is a slot that sits idle in one process
// while another could use it; that is bounded:
//
//   - an idle lease goes back to Redis after IdleHold unused (the reclaimer
//     releases what has expired in one script call);
//   - at once (one Pub/Sub message, then one script call) when anyone
//     else needs it: a waiter joins the line, a direct request anywhere
//     finds no free slot or its user at the limit (block.lua publishes
//     on ReclaimChannel), or an adaptive limit falls (adapt.lua);
//   - while waiters are in line (seen on ReclaimChannel, or counted in the
//     reply of an acquire or release) nothing is kept idle or handed out
//     from the cache: every release and acquire goes to Redis, where the
//     fairness rule applies, until a reply shows the line empty;
//   - nothing is kept idle unless this process's subscription to
//     ReclaimChannel is confirmed, nor while the pool was full when last
//     seen, nor in fallback: going to the fallback pool drops the cache
//     (its leases are released once Redis is back), and Close releases it;
//   - an idle lease is handed out only while its last grant or renewal is
//     younger than LeaseTTL/2, so a Redis that stopped answering renewals
//     is found by the next acquire that goes to Redis.
//
// A direct request of a user with no idle lease here, while another
// user's lease is idle, gives that one back in its own block.lua call
// (takeSwap): with many users, each seldom, a pair then costs one Redis
// call instead of two.
//
// A worker's job asks first as a direct request does (acquireRedis), so it
// takes an idle lease of its user too, and its lease goes idle when the
// job ends: a consumer's next job of the same user starts without a Redis
// call. A job that waits in line (the pool full, or older jobs waiting)
// is granted a lease that is never kept idle: waiters are served in
// Redis, in order.

// DefaultIdleHold is the idle time the app gives Config.IdleHold.
const DefaultIdleHold = 200 * time.Millisecond

// idleLease is a lease of this process that nobody uses.
type idleLease struct {
	id      string
	since   time.Time // when it went idle
	granted time.Time // when the acquire that granted it started
	spare   bool      // a spare lease nobody used yet (spare.go)
}

// takeIdle hands out an idle lease of user, or nil. No Redis call, no
// allocation but the returned lease.
func (p *Pool) takeIdle(user string) pool.Lease {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.startReclaimLocked()
	s := p.idle[user]
	// Handed to its own user an idle lease changes no count: the pool
	// being full is no reason to refuse it (a refusal elsewhere asks for
	// it back).
	if len(s) == 0 || !p.cacheOKLocked(false) {
		return nil
	}
	// The most recent first: the older ones age out.
	e := s[len(s)-1]
	if !p.freshLocked(e.granted) {
		return nil // the reclaimer gives it back
	}
	p.idle[user] = s[:len(s)-1]
	p.idleCount--
	p.heldDirectLocked(user, time.Now())
	return &lease{p: p, id: e.id, user: user, direct: true, granted: e.granted}
}

// swapLease is an idle lease of another user that a direct request's
// slot block gives back in the same call: a process serving many
// users, each seldom, then makes one Redis call per direct request
// instead of two (its own release goes idle, and the next request takes
// it back to Redis).
type swapLease struct{ id, user string }

// takeSwap takes the oldest idle lease of one user other than user out of
// the cache, or returns the zero swapLease. The caller gives it back to
// Redis in its slot block (acquireBlock).
func (p *Pool) takeSwap(user string) swapLease {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idleCount == 0 || !p.cacheOKLocked(false) {
		return swapLease{}
	}
	for u, s := range p.idle {
		if u == user || len(s) == 0 {
			continue
		}
		e := s[0]
		copy(s, s[1:])
		s[len(s)-1] = idleLease{}
		p.idle[u] = s[:len(s)-1]
		p.idleCount--
		delete(p.held, e.id)
		return swapLease{id: e.id, user: u}
	}
	return swapLease{}
}

// takeStale takes user's idle leases out of the cache when takeIdle could
// not hand one out (the cache is off for now, or they are not fresh): the
// caller gives them back in the same block as user's request, so they do
// not count against its per-user limit there.
func (p *Pool) takeStale(user string) []swapLease {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.idle[user]
	if len(s) == 0 {
		return nil
	}
	out := make([]swapLease, 0, len(s))
	for _, e := range s {
		delete(p.held, e.id)
		out = append(out, swapLease{id: e.id, user: user})
	}
	clear(s)
	delete(p.idle, user)
	p.idleCount -= len(out)
	return out
}

// putIdleLocked keeps lease id of user idle, if the rules allow.
func (p *Pool) putIdleLocked(id, user string, granted time.Time) bool {
	if !p.cacheOKLocked(true) || !p.freshLocked(granted) {
		return false
	}
	if p.idle == nil {
		p.idle = make(map[string][]idleLease)
	}
	p.idle[user] = append(p.idle[user], idleLease{id: id, since: time.Now(), granted: granted})
	p.idleCount++
	if p.idleCount == 1 {
		p.kickReclaim() // arm the idle timer
	}
	return true
}

// cacheOKLocked reports whether leases may be kept idle and handed out;
// with notFull, also whether the pool had a free slot when last seen: the
// pool's last slot is not parked idle.
func (p *Pool) cacheOKLocked(notFull bool) bool {
	if p.cfg.IdleHold <= 0 || p.closed || !p.subscribed || p.busy {
		return false
	}
	if fb, _ := p.mode(); fb {
		return false
	}
	if !notFull {
		return true
	}
	p.statsMu.Lock()
	full := p.inUse >= p.limit
	p.statsMu.Unlock()
	return !full
}

// freshLocked reports whether a lease granted at granted was granted or
// renewed less than LeaseTTL/2 ago.
func (p *Pool) freshLocked(granted time.Time) bool {
	return time.Since(maxTime(granted, p.renewedAt)) < p.cfg.LeaseTTL/2
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// noteWaiters takes the waiter count from a script reply; gen is
// reclaimGen when the call started. A line with waiters stops the cache
// and gives back what it holds; an empty one starts it again, unless a
// "waiting" message (or a new subscription) came since the call started.
func (p *Pool) noteWaiters(gen uint64, waiters int64) {
	if p.cfg.IdleHold <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case waiters > 0:
		p.busy = true
		if p.idleCount > 0 {
			p.flushAll = true
			p.kickReclaim()
		}
	case gen == p.reclaimGen.Load():
		p.busy = false
	}
}

// requestFlush asks the reclaimer to give back user's idle leases now;
// "" means all of them.
func (p *Pool) requestFlush(user string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requestFlushLocked(user)
}

func (p *Pool) requestFlushLocked(user string) {
	if p.idleCount == 0 {
		return
	}
	if user == "" {
		p.flushAll = true
	} else if len(p.idle[user]) > 0 {
		if p.flushUsers == nil {
			p.flushUsers = make(map[string]struct{})
		}
		p.flushUsers[user] = struct{}{}
	}
	p.kickReclaim()
}

func (p *Pool) kickReclaim() {
	select {
	case p.reclaimKick <- struct{}{}:
	default:
	}
}

func (p *Pool) startReclaimLocked() {
	if !p.reclaiming && p.cfg.IdleHold > 0 {
		p.reclaiming = p.goLocked(p.reclaimLoop)
	}
}

// dropIdleLocked empties the cache: the leases leave held and are filed
// for the next renewal round to release (in fallback, once Redis is back).
func (p *Pool) dropIdleLocked() {
	for user, s := range p.idle {
		for _, e := range s {
			delete(p.held, e.id)
			p.releaseLaterLocked(e.id, user)
		}
		delete(p.idle, user)
	}
	p.idleCount = 0
	p.flushAll, p.flushUsers = false, nil
}

// removeIdleLocked forgets lease id of user if it is idle (renewal found
// it expired).
func (p *Pool) removeIdleLocked(id, user string) {
	s := p.idle[user]
	for i, e := range s {
		if e.id == id {
			p.idle[user] = append(s[:i], s[i+1:]...)
			p.idleCount--
			return
		}
	}
}

// reclaimLoop owns the subscription to ReclaimChannel and gives idle
// leases back: when asked, and when they have been idle for IdleHold.
func (p *Pool) reclaimLoop() {
	var ps *redis.PubSub
	var msgs <-chan any
	defer func() {
		if ps != nil {
			_ = ps.Close()
		}
	}()
	idleTimer := time.NewTimer(time.Hour)
	idleTimer.Stop()
	defer idleTimer.Stop()
	retry := time.NewTicker(p.recheck)
	defer retry.Stop()
	for {
		if ps == nil {
			ps, msgs = p.subscribeReclaim()
		}
		if next := p.sweep(); next > 0 {
			idleTimer.Reset(next)
		} else {
			idleTimer.Stop()
		}
		select {
		case <-p.closing:
			return
		case <-p.reclaimKick:
		case <-idleTimer.C:
		case <-retry.C:
		case m, ok := <-msgs:
			if !ok {
				ps, msgs = nil, nil
				p.setSubscribed(false)
				continue
			}
			p.onReclaim(m)
			for drained := false; !drained; {
				select {
				case m, ok := <-msgs:
					if !ok {
						drained = true
						continue
					}
					p.onReclaim(m)
				default:
					drained = true
				}
			}
		}
	}
}

// subscribeReclaim returns a confirmed subscription to ReclaimChannel, or
// nils (the retry ticker tries again).
func (p *Pool) subscribeReclaim() (*redis.PubSub, <-chan any) {
	if fb, _ := p.mode(); fb {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	ps := p.rdb.Subscribe(ctx, p.reclaim)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		if rediserr.Classify(err) == rediserr.Gone {
			p.setFallback(true, err)
		}
		return nil, nil
	}
	p.setSubscribed(true)
	return ps, ps.ChannelWithSubscriptions()
}

// setSubscribed records a confirmed (or lost) subscription. Messages may
// have been missed before either: the line counts as busy until a reply
// shows it empty, and the cache is given back.
func (p *Pool) setSubscribed(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.subscribed, p.busy = on, true
	p.reclaimGen.Add(1)
	p.requestFlushLocked("")
}

// onReclaim handles one message of the subscription.
func (p *Pool) onReclaim(m any) {
	switch m := m.(type) {
	case *redis.Subscription:
		// Subscribed again after a reconnect: messages may be lost.
		if m.Kind == "subscribe" {
			p.setSubscribed(true)
		}
	case *redis.Message:
		switch {
		case m.Payload == "waiting":
			p.mu.Lock()
			p.busy = true
			p.reclaimGen.Add(1)
			p.requestFlushLocked("")
			p.mu.Unlock()
		case strings.HasPrefix(m.Payload, "user:"):
			p.requestFlush(strings.TrimPrefix(m.Payload, "user:"))
		default: // "full", "shrunk"
			p.requestFlush("")
		}
	}
}

// sweep gives back, in one script call, the idle leases that must go:
// all of them when asked or when the cache may not be used, a user's when
// asked, and those idle for IdleHold. It returns the time until the next
// idle lease reaches IdleHold, 0 when none is idle.
func (p *Pool) sweep() time.Duration {
	p.mu.Lock()
	if p.idleCount == 0 {
		p.flushAll, p.flushUsers = false, nil
		for u, s := range p.idle {
			if len(s) == 0 {
				delete(p.idle, u) // keep the map to active users
			}
		}
		p.mu.Unlock()
		return 0
	}
	now := time.Now()
	all := p.flushAll || !p.cacheOKLocked(false)
	var ids, users []string
	var next time.Duration
	for u, s := range p.idle {
		_, asked := p.flushUsers[u]
		keep := s[:0]
		for _, e := range s {
			left := p.cfg.IdleHold - now.Sub(e.since)
			if all || asked || left <= 0 || !p.freshLocked(e.granted) {
				if e.spare && left <= 0 {
					p.spareUnusedLocked(u)
				}
				ids, users = append(ids, e.id), append(users, u)
				delete(p.held, e.id)
				continue
			}
			keep = append(keep, e)
			if next == 0 || left < next {
				next = left
			}
		}
		clear(s[len(keep):])
		if len(keep) == 0 {
			delete(p.idle, u)
		} else {
			p.idle[u] = keep
		}
	}
	p.idleCount -= len(ids)
	p.flushAll, p.flushUsers = false, nil
	p.mu.Unlock()
	if len(ids) > 0 {
		p.releaseRedis(ids, users)
	}
	return next
}

// releaseBatch is how many leases one release.lua call gives back at most.
const releaseBatch = 256

// releaseRedis removes leases ids (of users) from Redis, in one call per
// releaseBatch. Releases that timed out or found Redis gone are kept for
// the next renewal round.
func (p *Pool) releaseRedis(ids, users []string) {
	for len(ids) > 0 {
		n := min(len(ids), releaseBatch)
		p.releaseRedisOnce(ids[:n], users[:n])
		ids, users = ids[n:], users[n:]
	}
}

func (p *Pool) releaseRedisOnce(ids, users []string) {
	_, err := p.runRelease(context.Background(), ids, users)
	if err == nil {
		return
	}
	var ue *unavailableError
	var se *slowError
	switch {
	case errors.As(err, &ue):
		// A primary demoted by a failover, or one that went away: the
		// release runs once Redis is back.
		p.releaseAllLater(ids, users)
		p.setFallback(true, err)
	case errors.As(err, &se):
		// The release may not have run: the next renewal round tries
		// again, so the slots are not held until the leases expire.
		p.releaseAllLater(ids, users)
		p.suspect(err)
	default:
		p.log.Warn("redispool: release failed; the leases expire by themselves", "leases", ids, "error", err)
	}
}

func (p *Pool) releaseAllLater(ids, users []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, id := range ids {
		p.releaseLaterLocked(id, users[i])
	}
}
