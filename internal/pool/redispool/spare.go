package redispool

import "time"

// Spare leases (docs/OPERATIONS.md, "Spare leases"). Idle leases let a
// user's next direct request skip Redis only within IdleHold of the last
// release: a burst that starts after a quiet spell (50 clients connecting
// at once) found none, and its requests waited in line for slot blocks,
// each one out only after the previous one's reply, so the last of the
// burst waited two or three Redis round trips before its provider call
// (about 25 ms at the 99th percentile of the first chunk at c = 50, where
// the bare hop waits for nothing). So a slot block that carries a user's
// direct requests also asks for spare leases of that user, up to the most
// direct leases the user held here at once within demandMemory: granted,
// each goes first to a request of that user that arrived while the call
// was out (it would have waited for the next block), then idle, where the
// rest of the burst takes them with no Redis call. A spare is an idle
// lease like any other: it counts in the pool and the user's limit, goes
// back after IdleHold unused or at once when anyone needs it, and none is
// asked for while the cache is off (waiters in line, the pool full when
// last seen, fallback). A spare never takes the pool's or the user's last
// slots: a block asks for spares only while both limits, as this process
// last saw them, keep twice the block's requests and spares free. A spare
// that goes back unused after IdleHold lowers the remembered peak by one,
// so a trickle of requests after a big burst stops asking for spares after
// the first.

// demandMemory is how long a user's peak of direct leases held at once
// in this process is remembered as what its next burst will want.
const demandMemory = 5 * time.Minute

// defaultSpareMaxCall: while the last block call took longer, no spares
// are asked for: behind a slow Redis, leases given back wait in blocks
// and still count in the user's limit, so spares could refuse a request.
// (Pool.spareMaxCall; tests of spares on a loaded machine raise it.)
const defaultSpareMaxCall = 50 * time.Millisecond

// maxSpares bounds the spare leases of one block.
const maxSpares = 256

// maxDemandUsers bounds the users whose peak is remembered; past it, stale
// entries are dropped (once per pruneEvery at most), and a new user is not
// remembered while none is.
const (
	maxDemandUsers = 4096
	pruneEvery     = demandMemory / 10
)

// demand is the most direct leases of one user held at once in this
// process, and when that was last reached.
type demand struct {
	peak int
	at   time.Time
}

// heldDirectLocked counts a direct lease of user handed to a caller.
func (p *Pool) heldDirectLocked(user string, now time.Time) {
	if p.cfg.IdleHold <= 0 {
		return
	}
	if p.active == nil {
		p.active = make(map[string]int)
		p.demand = make(map[string]demand)
	}
	n := p.active[user] + 1
	p.active[user] = n
	d, ok := p.demand[user]
	if !ok && len(p.demand) >= maxDemandUsers {
		// At most one sweep per pruneEvery: an api serving many identities
		// does not walk the map on every request of a new one.
		if now.Sub(p.demandPruned) < pruneEvery {
			return
		}
		p.demandPruned = now
		for u, e := range p.demand {
			if now.Sub(e.at) >= demandMemory && p.active[u] == 0 {
				delete(p.demand, u)
			}
		}
		if len(p.demand) >= maxDemandUsers {
			return
		}
	}
	if n >= d.peak || now.Sub(d.at) >= demandMemory {
		p.demand[user] = demand{peak: n, at: now}
	}
}

// releasedDirectLocked counts a direct lease of user given back by its
// caller.
func (p *Pool) releasedDirectLocked(user string) {
	if n := p.active[user]; n > 1 {
		p.active[user] = n - 1
	} else {
		delete(p.active, user)
	}
}

// spareUnusedLocked lowers user's remembered peak by one spare that went
// back unused after IdleHold: a burst smaller than the peak, or a trickle
// after a burst, stops asking for what it does not take.
func (p *Pool) spareUnusedLocked(user string) {
	d, ok := p.demand[user]
	if !ok {
		return
	}
	if d.peak <= 1 {
		delete(p.demand, user)
		return
	}
	d.peak--
	p.demand[user] = d
}

// sparesLocked returns the spare requests to add to a block that carries
// reqs: per user with direct requests in it, what its remembered peak
// wants beyond what it holds, what is idle and what the block asks for.
func (p *Pool) sparesLocked(reqs []*blockReq, now time.Time) []*blockReq {
	if p.cfg.IdleHold <= 0 || len(p.demand) == 0 || p.slowBlocks.Load() || !p.cacheOKLocked(true) {
		return nil
	}
	p.statsMu.Lock()
	room := p.limit - p.inUse
	p.statsMu.Unlock()
	budget := min(maxSpares, maxBlock-len(reqs), room/2-len(reqs))
	if budget <= 0 {
		return nil
	}
	asked := make(map[string]int, 1)
	for _, r := range reqs {
		asked[r.user]++
	}
	var spares []*blockReq
	for _, r := range reqs {
		n, ok := asked[r.user]
		if !ok {
			continue
		}
		delete(asked, r.user) // once per user
		d := p.demand[r.user]
		if now.Sub(d.at) >= demandMemory {
			continue
		}
		have := p.active[r.user] + len(p.idle[r.user]) + n
		want := min(d.peak-have, budget, p.cfg.PerUser/2-have)
		for range want {
			spares = append(spares, &blockReq{user: r.user, id: p.newLeaseID(), spare: true})
		}
		budget -= max(want, 0)
		if budget <= 0 {
			break
		}
	}
	return spares
}

// spareGrantedLocked places a spare lease id of user granted by the call
// that started at start: to a direct request of user still waiting for
// a block, else idle; it returns false when neither could take it (the
// caller gives it back).
func (p *Pool) spareGrantedLocked(id, user string, start, now time.Time) bool {
	for _, r := range p.blockReqs {
		if r.user != user || !r.state.CompareAndSwap(reqPending, reqDelivered) {
			continue
		}
		l := p.grantLocked(id, user)
		l.direct, l.granted = true, start
		p.heldDirectLocked(user, now)
		r.res <- blockRes{lease: l, code: codeGranted}
		return true
	}
	p.grantLocked(id, user) // held and renewed, as any idle lease
	if p.putIdleLocked(id, user, start) {
		s := p.idle[user]
		s[len(s)-1].spare = true
		return true
	}
	delete(p.held, id)
	return false
}
