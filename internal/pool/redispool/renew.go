package redispool

import (
	"context"
	"errors"
	"slices"
	"time"
)

// renewLoop renews this process's leases and waiters every LeaseTTL/3, and
// at once when asked (Stats refresh, return from fallback).
func (p *Pool) renewLoop() {
	t := time.NewTicker(p.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-p.closing:
			return
		case <-t.C:
		case <-p.statsKick:
		}
		p.renew()
	}
}

// renew is one renewal round, a single script call however much is held.
func (p *Pool) renew() {
	if fb, _ := p.mode(); fb {
		return // Redis is away; the probe brings us back
	}
	start := time.Now()
	p.mu.Lock()
	leases := make(map[string]string, len(p.held))
	for id, user := range p.held {
		leases[id] = user
	}
	var members []string
	for _, w := range p.waiters {
		if w.registered && !w.gone {
			members = append(members, w.member)
		}
	}
	orphans := p.orphans
	p.orphans = nil
	unreleased := p.unreleased
	p.unreleased = nil
	p.mu.Unlock()
	// Live leases first: a long list of releases on a slow Redis must not
	// delay their renewal past LeaseTTL.
	lostLeases, lostWaiters, err := p.runRenew(context.Background(), leases, members)
	defer p.settleLater(orphans, unreleased)
	if err != nil {
		var ue *unavailableError
		var se *slowError
		switch {
		case errors.As(err, &ue):
			p.setFallback(true, err)
		case errors.As(err, &se):
			// Two more rounds come before a lease expires.
			p.suspect(err)
			p.log.Warn("redispool: renewal timed out; next round in LeaseTTL/3", "error", err)
		default:
			p.log.Warn("redispool: renewal failed", "error", err)
		}
		return
	}

	p.mu.Lock()
	p.renewedAt = maxTime(p.renewedAt, start)
	var lost []string
	for _, id := range lostLeases {
		// A lease released since the snapshot is gone on purpose.
		if user, ok := p.held[id]; ok {
			delete(p.held, id)
			p.removeIdleLocked(id, user)
			lost = append(lost, id)
		}
	}
	rejoin := false
	for _, w := range p.waiters {
		if !w.gone && w.registered && !w.inflight && slices.Contains(lostWaiters, w.member) {
			w.registered = false // the next pass registers it again, at the back
			rejoin = true
		}
	}
	p.mu.Unlock()
	if len(lost) > 0 {
		p.log.Warn("redispool: leases expired before renewal; their slots may be in use twice until they are released",
			"count", len(lost), "leases", lost)
	}
	if rejoin {
		p.kickDispatch()
	}
}

// settleLater withdraws the waiter entries and releases the leases filed
// for a renewal round, for at most LeaseTTL/6; what is left, or fails
// again, is filed for the next round.
func (p *Pool) settleLater(orphans []string, unreleased map[string]string) {
	deadline := time.Now().Add(p.cfg.LeaseTTL / 6)
	for _, m := range orphans {
		if fb, _ := p.mode(); fb || time.Now().After(deadline) {
			p.mu.Lock()
			p.orphans = append(p.orphans, m)
			p.mu.Unlock()
			continue
		}
		p.leave(m) // keeps it an orphan if Redis fails again
	}
	if len(unreleased) == 0 {
		return
	}
	ids := make([]string, 0, len(unreleased))
	users := make([]string, 0, len(unreleased))
	for id, user := range unreleased {
		ids, users = append(ids, id), append(users, user)
	}
	if fb, _ := p.mode(); fb || time.Now().After(deadline) {
		p.releaseAllLater(ids, users) // gone, or out of time: the next round
		return
	}
	p.releaseRedis(ids, users) // in batches; files them again if Redis is still slow or gone
}
