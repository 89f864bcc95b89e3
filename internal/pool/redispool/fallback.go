package redispool

import (
	"context"
	"time"
)

// mode returns whether the fallback pool is in use and a channel closed
// at the next switch.
func (p *Pool) mode() (fallback bool, changed <-chan struct{}) {
	p.modeMu.Lock()
	defer p.modeMu.Unlock()
	return p.fallback, p.changed
}

// setFallback switches to the fallback pool (on) or back to Redis. Only a
// real switch logs, calls onFallback and, going to fallback, starts the
// probe. After Close nothing switches: a client closed by main after Close
// is not an outage.
func (p *Pool) setFallback(on bool, cause error) {
	p.transMu.Lock()
	defer p.transMu.Unlock()
	if p.isClosed() {
		return
	}
	p.modeMu.Lock()
	if p.fallback == on {
		p.modeMu.Unlock()
		return
	}
	p.fallback = on
	close(p.changed)
	p.changed = make(chan struct{})
	p.modeMu.Unlock()

	if on {
		p.log.Warn("redispool: Redis gone, serving slots from the local fallback pool",
			"error", cause, "fallback_size", p.cfg.FallbackSize, "down_after", p.cfg.DownAfter)
		p.mu.Lock()
		p.goLocked(p.probe)
		// Idle leases are not handed out from a Redis that is gone: they
		// are released once it is back (idle.go).
		p.dropIdleLocked()
		p.busy = true
		p.mu.Unlock()
	} else {
		p.log.Info("redispool: Redis reachable again, back to the distributed pool")
		// Renew now what was held through the outage, and withdraw the
		// waiter entries it left behind. Messages on ReclaimChannel may
		// have been missed: the line counts as busy until a reply shows it
		// empty.
		p.mu.Lock()
		p.busy = true
		p.reclaimGen.Add(1)
		p.mu.Unlock()
		p.kickRenew()
	}
	if p.onFallback != nil {
		p.onFallback(on)
	}
}

// probe runs the health probe every second while in fallback and
// switches back on the first answer.
func (p *Pool) probe() {
	t := time.NewTicker(p.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-p.closing:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := p.probeOnce(ctx)
		cancel()
		if err == nil {
			p.setFallback(false, nil)
			return
		}
	}
}
