package redispool

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/pool"
)

// Slot blocks (docs/OPERATIONS.md, "Slot blocks"). Direct requests that
// need Redis (TryAcquire without an idle lease, a waiter's first try) and
// leases given back do not make a script call each: they join the
// process's next block, and one goroutine sends a block at a time as one
// block.lua call. What arrives while a call is out waits for the next one,
// so under load the pool's primary sees a call per block, not per stream,
// and a lone request still goes at once. Each request in a block is judged
// by block.lua's rules for a direct request, in arrival order, so both
// limits and the waiters' precedence hold exactly. The dispatcher's
// waiters go in block.lua calls of their own (wait.go): block.lua is the
// one script that grants slots.
//
// A block that Redis is slow to answer is waited for, not refused: after
// callTimeout the health watch starts (health.go), and the block waits
// for its reply until the watch judges Redis gone (no probe answer for
// DownAfter): its requests then go to the fallback pool. Only a block
// that outlives even that (a probe that answers while the block's call
// does not) tells its requests the pool is exhausted. A request whose caller gave up meanwhile leaves
// the block; a lease granted to it goes back in the next block.

//go:embed block.lua
var blockSource string
var blockScript = redis.NewScript(blockSource)

// maxBlock bounds the requests, and separately the leases given back, of
// one block.lua call.
const maxBlock = 512

// blockReq is one request waiting for a block.
type blockReq struct {
	user  string
	id    string // the lease id it is granted under
	spare bool   // a spare lease asked for with the block (spare.go): no caller, res unused
	// state: reqPending until the block's goroutine delivers (reqDelivered:
	// its block's answer, or a spare lease while it still waited) or the
	// caller gives up (reqGone).
	state atomic.Int32
	res   chan blockRes // cap 1
}

const (
	reqPending int32 = iota
	reqDelivered
	reqGone
)

type blockRes struct {
	lease *lease
	code  int64
	err   error
}

// blockRel is a lease given back in a block; done, if not nil, is closed
// once the call carrying it ended.
type blockRel struct {
	id, user string
	done     chan struct{}
}

// acquireBlock is one direct attempt: it asks for a slot for user in the
// next block, the Redis path of TryAcquire and of a worker's first try.
// Its lease may be kept idle when released. Besides a refusal (wrapping
// pool.ErrPoolExhausted or pool.ErrUserLimit), ctx's error and ErrClosed,
// a failed block's error wraps an *unavailableError when Redis is judged
// gone (the caller goes to the fallback pool) or a *slowError when it did
// not answer in time (health.go).
func (p *Pool) acquireBlock(ctx context.Context, user string) (pool.Lease, error) {
	r := &blockReq{user: user, id: p.newLeaseID(), res: make(chan blockRes, 1)}
	var back []swapLease
	if p.cfg.IdleHold > 0 {
		// user's own idle leases, which takeIdle could not hand out,
		// go back first: they would count against its per-user limit.
		back = p.takeStale(user)
		if s := p.takeSwap(user); s.id != "" {
			back = append(back, s)
		}
	}
	p.mu.Lock()
	if p.closed {
		for _, s := range back {
			p.releaseLaterLocked(s.id, s.user) // no-op: Close releases what it holds
		}
		p.mu.Unlock()
		return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ErrClosed)
	}
	for _, s := range back {
		p.blockRels = append(p.blockRels, blockRel{id: s.id, user: s.user})
	}
	p.blockReqs = append(p.blockReqs, r)
	p.startBlocksLocked()
	p.mu.Unlock()
	p.kickBlock()

	var res blockRes
	select {
	case res = <-r.res:
	case <-ctx.Done():
		if r.state.CompareAndSwap(reqPending, reqGone) {
			return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ctx.Err())
		}
		res = <-r.res // delivered just now
	}
	if res.err != nil {
		return nil, res.err
	}
	switch res.code {
	case codeGranted:
		return res.lease, nil
	case codeUserLimit:
		return nil, fmt.Errorf("redispool: acquire for %s: %w", user, pool.ErrUserLimit)
	case codeReserved:
		return nil, fmt.Errorf("redispool: acquire for %s: free slots go to older waiting jobs: %w", user, pool.ErrPoolExhausted)
	default:
		return nil, fmt.Errorf("redispool: acquire for %s: %w", user, pool.ErrPoolExhausted)
	}
}

// releaseBlock gives lease id of user back in the next block and waits
// until the call carrying it ended (or Close).
func (p *Pool) releaseBlock(id, user string) {
	done := make(chan struct{})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.blockRels = append(p.blockRels, blockRel{id: id, user: user, done: done})
	p.startBlocksLocked()
	p.mu.Unlock()
	p.kickBlock()
	select {
	case <-done:
	case <-p.closing:
	}
}

func (p *Pool) kickBlock() {
	select {
	case p.blockKick <- struct{}{}:
	default:
	}
}

func (p *Pool) startBlocksLocked() {
	if !p.blocking {
		p.blocking = p.goLocked(p.blockLoop)
	}
}

// blockLoop sends the blocks, one call at a time.
func (p *Pool) blockLoop() {
	for {
		select {
		case <-p.closing:
			p.failBlocks()
			return
		case <-p.blockKick:
		}
		for {
			reqs, rels := p.takeBlock()
			if len(reqs) == 0 && len(rels) == 0 {
				break
			}
			p.runBlock(reqs, rels)
		}
	}
}

// takeBlock takes up to maxBlock requests still waiting and as many
// leases to give back.
func (p *Pool) takeBlock() ([]*blockReq, []blockRel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var reqs []*blockReq
	n := 0
	for _, r := range p.blockReqs {
		n++
		if r.state.Load() != reqPending {
			continue // gone, or given a spare lease meanwhile
		}
		reqs = append(reqs, r)
		if len(reqs) == maxBlock {
			break
		}
	}
	p.blockReqs = p.blockReqs[n:]
	m := min(len(p.blockRels), maxBlock)
	rels := p.blockRels[:m:m]
	p.blockRels = p.blockRels[m:]
	if len(p.blockReqs) == 0 {
		p.blockReqs = nil
	}
	if len(p.blockRels) == 0 {
		p.blockRels = nil
	}
	return reqs, rels
}

// failBlocks answers what still waits for a block once the Pool closed;
// the leases to give back go to Close with the held ones.
func (p *Pool) failBlocks() {
	p.mu.Lock()
	reqs, rels := p.blockReqs, p.blockRels
	p.blockReqs, p.blockRels = nil, nil
	p.mu.Unlock()
	for _, r := range reqs {
		p.deliver(r, blockRes{err: fmt.Errorf("redispool: acquire for %s: %w", r.user, ErrClosed)})
	}
	p.closedRels(rels)
	closeRels(rels)
}

// closedRels hands leases given back after Close began to Close's cleanup
// (unreleased); it runs before Close reads them (the goroutines end first).
func (p *Pool) closedRels(rels []blockRel) {
	p.mu.Lock()
	for _, rel := range rels {
		if p.unreleased == nil {
			p.unreleased = make(map[string]string)
		}
		p.unreleased[rel.id] = rel.user
	}
	p.mu.Unlock()
}

func closeRels(rels []blockRel) {
	for _, rel := range rels {
		if rel.done != nil {
			close(rel.done)
		}
	}
}

// deliver hands res to r unless its caller gave up; it reports whether it
// did.
func (p *Pool) deliver(r *blockReq, res blockRes) bool {
	if r.spare || !r.state.CompareAndSwap(reqPending, reqDelivered) {
		return false
	}
	r.res <- res
	return true
}

// waitTry is one waiter tried in a block.lua call (the dispatcher's
// pass, wait.go).
type waitTry struct {
	user, id, member string // id: the lease id it is granted under
	since            int64  // its place in line, µs since the epoch
	deferring        bool
}

// blockCall returns block.lua's keys and arguments for leases given back,
// waiters tried and direct requests, in that order.
func (p *Pool) blockCall(rels []blockRel, ws []waitTry, reqs []*blockReq) ([]string, []any) {
	// Without an adaptive limit the fourth key is never read; the leases
	// key stands in so that every key stays in the {pool} slot.
	limitKey, adaptive := p.limitKey, "1"
	if limitKey == "" {
		limitKey, adaptive = p.leasesKey, "0"
	}
	keys := make([]string, 0, 4+len(rels)+len(ws)+len(reqs))
	keys = append(keys, p.leasesKey, p.waitersKey, p.waiterExpKey, limitKey)
	args := make([]any, 0, 9+len(rels)+4*len(ws)+len(reqs))
	args = append(args, p.cfg.Size, p.cfg.PerUser, p.ttlMS, p.userPrefix, adaptive, p.reclaim, p.channel, len(rels), len(ws))
	for _, rel := range rels {
		keys = append(keys, UserKey(p.cfg.Prefix, rel.user))
		args = append(args, rel.id)
	}
	for _, w := range ws {
		deferring := "0"
		if w.deferring {
			deferring = "1"
		}
		keys = append(keys, UserKey(p.cfg.Prefix, w.user))
		args = append(args, w.id, w.member, w.since, deferring)
	}
	for _, r := range reqs {
		keys = append(keys, UserKey(p.cfg.Prefix, r.user))
		args = append(args, r.id)
	}
	return keys, args
}

// blockReply is block.lua's answer.
type blockReply struct {
	inUse, size, waiting, released int64
	waiters                        []waitReply // per waiter tried, in order
	codes                          []int64     // per direct request, in order
}

type waitReply struct {
	code     int64
	enqueued int64 // its place in line (µs), its score in WaitersKey
}

// parseBlock reads the reply of a block.lua call with w waiters and n
// direct requests.
func parseBlock(v any, w, n int) (blockReply, error) {
	a, err := ints(v, 4+2*w+n)
	if err != nil {
		return blockReply{}, err
	}
	rep := blockReply{inUse: a[0], size: a[1], waiting: a[2], released: a[3], codes: a[4+2*w:]}
	if w > 0 {
		rep.waiters = make([]waitReply, w)
		for j := range rep.waiters {
			rep.waiters[j] = waitReply{code: a[4+2*j], enqueued: a[5+2*j]}
		}
	}
	return rep, nil
}

// runBlock makes one block.lua call for reqs and rels and answers them.
func (p *Pool) runBlock(reqs []*blockReq, rels []blockRel) {
	defer closeRels(rels)
	if fb, _ := p.mode(); fb {
		p.unavailableBlock(reqs, rels, nil)
		return
	}
	start := time.Now()
	p.mu.Lock()
	reqs = append(reqs, p.sparesLocked(reqs, start)...)
	p.mu.Unlock()
	keys, args := p.blockCall(rels, nil, reqs)
	what := fmt.Sprintf("block of %d requests and %d releases", len(reqs), len(rels))
	gen := p.reclaimGen.Load()
	v, err := p.callBlock(keys, args, what, func(v any) { p.lateBlock(reqs, v) })
	p.slowBlocks.Store(time.Since(start) > time.Duration(p.spareMaxCall.Load()))
	if err == nil {
		var rep blockReply
		if rep, err = parseBlock(v, 0, len(reqs)); err == nil {
			p.setStats(int(rep.inUse))
			if len(reqs) > 0 {
				p.setLimit(int(rep.size))
			}
			p.noteWaiters(gen, rep.waiting)
			p.answerBlock(reqs, rep.codes, start)
			return
		}
		err = fmt.Errorf("redispool: %s: %w", what, err)
	}
	var ue *unavailableError
	var se *slowError
	switch {
	case errors.Is(err, ErrClosed):
		p.closedRels(rels) // Close gives them back with the held ones
		for _, r := range reqs {
			p.deliver(r, blockRes{err: fmt.Errorf("redispool: acquire for %s: %w", r.user, ErrClosed)})
		}
		return
	case errors.Is(err, errModeChanged):
		p.unavailableBlock(reqs, rels, err)
		return
	case errors.As(err, &ue):
		p.setFallback(true, err)
		p.unavailableBlock(reqs, rels, err)
		return
	case errors.As(err, &se):
		p.suspect(err)
	}
	// The call may have run, or run later: what it may have granted and
	// given back is settled by the next renewal round.
	p.releaseAllLater(relIDs(rels))
	for _, r := range reqs {
		p.forget(r.id, r.user, "")
		p.deliver(r, blockRes{err: fmt.Errorf("redispool: acquire for %s: %w", r.user, err)})
	}
}

func relIDs(rels []blockRel) (ids, users []string) {
	for _, rel := range rels {
		ids, users = append(ids, rel.id), append(users, rel.user)
	}
	return ids, users
}

// unavailableBlock answers a block Redis could not take because it is
// gone: its requests go to the fallback pool (an *unavailableError), its
// releases wait for Redis to come back.
func (p *Pool) unavailableBlock(reqs []*blockReq, rels []blockRel, cause error) {
	if cause == nil {
		cause = errModeChanged
	}
	p.releaseAllLater(relIDs(rels))
	for _, r := range reqs {
		p.forget(r.id, r.user, "") // in case the call ran
		p.deliver(r, blockRes{err: &unavailableError{fmt.Errorf("redispool: acquire for %s: %w", r.user, cause)}})
	}
}

// answerBlock hands each request its code; a lease granted to a caller
// that gave up goes back in the next block.
func (p *Pool) answerBlock(reqs []*blockReq, codes []int64, start time.Time) {
	var back []blockRel
	now := time.Now()
	p.mu.Lock()
	for i, r := range reqs {
		if codes[i] != codeGranted {
			p.deliver(r, blockRes{code: codes[i]})
			continue
		}
		if r.spare {
			if !p.spareGrantedLocked(r.id, r.user, start, now) {
				back = append(back, blockRel{id: r.id, user: r.user})
			}
			continue
		}
		if !r.state.CompareAndSwap(reqPending, reqDelivered) {
			back = append(back, blockRel{id: r.id, user: r.user})
			continue
		}
		l := p.grantLocked(r.id, r.user)
		l.direct, l.granted = true, start
		p.heldDirectLocked(r.user, now)
		r.res <- blockRes{lease: l, code: codeGranted}
	}
	switch {
	case len(back) == 0:
	case p.closed:
		p.mu.Unlock()
		p.closedRels(back) // Close gives them back with the held ones
		return
	default:
		p.blockRels = append(p.blockRels, back...)
		p.kickBlock()
	}
	p.mu.Unlock()
}

// lateBlock handles the reply of a block that was given up (Redis judged
// gone, or Close): the leases it granted have no holder.
func (p *Pool) lateBlock(reqs []*blockReq, v any) {
	rep, err := parseBlock(v, 0, len(reqs))
	if err != nil {
		return
	}
	var ids, users []string
	for i, r := range reqs {
		if rep.codes[i] == codeGranted {
			ids, users = append(ids, r.id), append(users, r.user)
		}
	}
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, _ = p.runRelease(ctx, ids, users)
}

// callBlock runs block.lua. From callTimeout on the health watch runs,
// and its verdict that Redis is gone (DownAfter later at the latest) ends
// the wait with errModeChanged, as Close does with ErrClosed; the call
// itself is bounded just past that verdict. late gets the reply of a call
// given up that succeeds after all.
func (p *Pool) callBlock(keys []string, args []any, what string, late func(any)) (any, error) {
	bound := callTimeout + p.cfg.DownAfter + probeTimeout
	cctx, cancel := context.WithTimeout(context.Background(), bound)
	ch, abandon := p.startCall(cctx, cancel, blockScript, late, keys, args)
	_, changed := p.mode()
	slow := time.NewTimer(callTimeout)
	defer slow.Stop()
	for {
		var r scriptReply
		var ok bool
		select {
		case r = <-ch:
		case <-slow.C:
			p.suspect(&slowError{fmt.Errorf("redispool: %s: no answer in %s", what, callTimeout)})
			continue
		case <-cctx.Done():
			if r, ok = abandon(); !ok {
				r.err = cctx.Err()
			}
		case <-changed:
			if r, ok = abandon(); !ok {
				return nil, errModeChanged
			}
		case <-p.closing:
			if r, ok = abandon(); !ok {
				return nil, fmt.Errorf("redispool: %s: %w", what, ErrClosed)
			}
		}
		if r.err == nil {
			return r.v, nil
		}
		return nil, classified(fmt.Errorf("redispool: %s: %w", what, r.err), r.err)
	}
}
