package redispool

import "context"

// idleLen returns how many leases are idle (tests).
func (p *Pool) idleLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idleCount
}

// acquireReply is one request's answer from block.lua (tests).
type acquireReply struct {
	code     int64
	inUse    int64
	enqueued int64 // the waiter's place in line (µs), 0 for direct
	size     int64 // the global size applied: Size, or the adaptive limit
}

// runAcquire runs block.lua for one request alone, lease id of user: a
// direct request when member is "", else the waiter member, whose place
// in line is since (µs since the epoch; 0 means now).
func (p *Pool) runAcquire(ctx context.Context, user, id, member string, since int64) (acquireReply, error) {
	var ws []waitTry
	var reqs []*blockReq
	if member == "" {
		reqs = []*blockReq{{user: user, id: id}}
	} else {
		ws = []waitTry{{user: user, id: id, member: member, since: since}}
	}
	keys, args := p.blockCall(nil, ws, reqs)
	v, err := p.run(ctx, callTimeout, blockScript, "acquire for "+user, nil, keys, args...)
	if err != nil {
		return acquireReply{}, err
	}
	rep, err := parseBlock(v, len(ws), len(reqs))
	if err != nil {
		return acquireReply{}, err
	}
	p.setStats(int(rep.inUse))
	p.setLimit(int(rep.size))
	out := acquireReply{inUse: rep.inUse, size: rep.size}
	if member == "" {
		out.code = rep.codes[0]
	} else {
		out.code, out.enqueued = rep.waiters[0].code, rep.waiters[0].enqueued
	}
	return out, nil
}
