package redispool

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/rediserr"
)

var (
	//go:embed release.lua
	releaseSource string
	releaseScript = redis.NewScript(releaseSource)

	//go:embed leave.lua
	leaveSource string
	leaveScript = redis.NewScript(leaveSource)

	//go:embed renew.lua
	renewSource string
	renewScript = redis.NewScript(renewSource)

	//go:embed adapt.lua
	adaptSource string
	adaptScript = redis.NewScript(adaptSource)
)

// Result codes of block.lua.
const (
	codeGranted   = 0
	codeExhausted = 1 // no free slot, or (for a waiter) older waiters take them
	codeUserLimit = 2
	codeReserved  = 3 // direct request: the free slots go to waiters
)

// run runs a script bounded by timeout, also when the client does not
// honour context deadlines (go-redis without ContextTimeoutEnabled waits
// up to its ReadTimeout on a hung server): the call is then abandoned to a
// goroutine the Pool waits for in Close, and late, if not nil, gets its
// reply should it succeed after all. Unless ctx itself had ended, an error
// is an *unavailableError when Redis is gone and a *slowError when it did
// not answer in time (health.go).
func (p *Pool) run(ctx context.Context, timeout time.Duration, s *redis.Script, what string, late func(any), keys []string, args ...any) (any, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	ch, abandon := p.startCall(cctx, cancel, s, late, keys, args)
	var r scriptReply
	select {
	case r = <-ch:
	case <-cctx.Done():
		var ok bool
		if r, ok = abandon(); !ok {
			r.err = cctx.Err()
		}
	}
	if r.err != nil {
		err := fmt.Errorf("redispool: %s: %w", what, r.err)
		if ctx.Err() != nil {
			return nil, err // the caller gave up: says nothing about Redis
		}
		return nil, classified(err, r.err)
	}
	return r.v, nil
}

// scriptReply is what a script call answered.
type scriptReply struct {
	v   any
	err error
}

// startCall runs s in a goroutine the Pool waits for in Close, bounded by
// cctx, which cancel ends once the call returned. Its reply comes on ch
// unless the caller abandons it first: abandon reports false when it did
// (late, if not nil, then gets the reply should it succeed after all),
// and true with the reply when that had been delivered just now.
func (p *Pool) startCall(cctx context.Context, cancel context.CancelFunc, s *redis.Script, late func(any), keys []string, args []any) (ch <-chan scriptReply, abandon func() (scriptReply, bool)) {
	const pending, delivered, abandoned = 0, 1, 2
	var state atomic.Int32
	c := make(chan scriptReply, 1)
	done := p.trackCall()
	go func() {
		defer done()
		defer cancel()
		v, err := s.Run(cctx, p.rdb, keys, args...).Result()
		if state.CompareAndSwap(pending, delivered) {
			c <- scriptReply{v, err}
		} else if err == nil && late != nil {
			late(v)
		}
	}()
	return c, func() (scriptReply, bool) {
		if state.CompareAndSwap(pending, abandoned) {
			return scriptReply{}, false
		}
		return <-c, true
	}
}

// classified is err, the wrapped form of a failed call's cause, as an
// *unavailableError when Redis is gone and a *slowError when it is busy.
func classified(err, cause error) error {
	switch rediserr.Classify(cause) {
	case rediserr.Gone:
		return &unavailableError{err}
	case rediserr.Busy:
		return &slowError{err}
	}
	return err
}

// trackCall counts a script call for Close to wait on; calls that start
// once Close waits are not counted (they end within their own bound).
func (p *Pool) trackCall() (done func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.callsDrained {
		return func() {}
	}
	p.calls.Add(1)
	return p.calls.Done
}

// runWaiters tries waiters ws in one block.lua call (the dispatcher's
// pass): each is registered if it was not, then granted or left in line
// by the fairness rule, in order.
func (p *Pool) runWaiters(ctx context.Context, ws []waitTry) (blockReply, error) {
	keys, args := p.blockCall(nil, ws, nil)
	what := fmt.Sprintf("try %d waiters", len(ws))
	gen := p.reclaimGen.Load()
	// The script ran after the caller was told it failed (Redis was slow or
	// paused): a lease it granted has no holder. The waiter entries it
	// (re)registered belong to waiters that moved on under new members
	// (wait.go); forget below files them for renewal to withdraw.
	late := func(v any) {
		rep, err := parseBlock(v, len(ws), 0)
		if err != nil {
			return
		}
		var ids, users []string
		for j, w := range ws {
			if rep.waiters[j].code == codeGranted {
				ids, users = append(ids, w.id), append(users, w.user)
			}
		}
		if len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer cancel()
			_, _ = p.runRelease(ctx, ids, users)
		}
	}
	v, err := p.run(ctx, callTimeout, blockScript, what, late, keys, args...)
	if err != nil {
		if _, slow := errors.AsType[*slowError](err); slow {
			// The script may have run, or run later, and its late reply is
			// never read when the client stops reading at the deadline
			// (ContextTimeoutEnabled): the next renewal round withdraws
			// what it may have granted or registered, so no lease is held
			// by nobody for longer than LeaseTTL/3.
			for _, w := range ws {
				p.forget(w.id, w.user, w.member)
			}
		}
		return blockReply{}, err
	}
	rep, err := parseBlock(v, len(ws), 0)
	if err != nil {
		return blockReply{}, fmt.Errorf("redispool: %s: %w", what, err)
	}
	p.setStats(int(rep.inUse))
	p.setLimit(int(rep.size))
	p.noteWaiters(gen, rep.waiting)
	return rep, nil
}

// runRelease runs release.lua for lease ids[i] of users[i], in one call;
// it reports how many live leases were removed.
func (p *Pool) runRelease(ctx context.Context, ids, users []string) (int, error) {
	keys := make([]string, 0, 2+len(ids))
	keys = append(keys, p.leasesKey, p.waitersKey)
	args := make([]any, 0, 1+len(ids))
	args = append(args, p.channel)
	for i, id := range ids {
		keys = append(keys, UserKey(p.cfg.Prefix, users[i]))
		args = append(args, id)
	}
	what := "release " + ids[0]
	if len(ids) > 1 {
		what = fmt.Sprintf("release %d leases", len(ids))
	}
	gen := p.reclaimGen.Load()
	v, err := p.run(ctx, releaseTimeout, releaseScript, what, nil, keys, args...)
	if err != nil {
		return 0, err
	}
	n, err := ints(v, 3)
	if err != nil {
		return 0, fmt.Errorf("redispool: %s: %w", what, err)
	}
	p.setStats(int(n[1]))
	p.noteWaiters(gen, n[2])
	return int(n[0]), nil
}

// runLeave withdraws a registered waiter.
func (p *Pool) runLeave(ctx context.Context, member string) error {
	_, err := p.run(ctx, callTimeout, leaveScript, "leave "+member, nil,
		[]string{p.waitersKey, p.waiterExpKey, p.leasesKey}, member, p.channel, p.cfg.Size)
	return err
}

// runRenew extends the given leases (id → user) and waiters; it returns
// the lease ids and waiter members Redis no longer had.
func (p *Pool) runRenew(ctx context.Context, leases map[string]string, members []string) (lostLeases, lostWaiters []string, err error) {
	keys := make([]string, 0, 3+len(leases))
	keys = append(keys, p.leasesKey, p.waitersKey, p.waiterExpKey)
	args := make([]any, 0, 2+len(leases)+len(members))
	args = append(args, p.ttlMS, len(leases))
	for id, user := range leases {
		keys = append(keys, UserKey(p.cfg.Prefix, user))
		args = append(args, id)
	}
	for _, m := range members {
		args = append(args, m)
	}
	v, err := p.run(ctx, min(p.cfg.LeaseTTL/3, releaseTimeout), renewScript, "renew", nil, keys, args...)
	if err != nil {
		return nil, nil, err
	}
	parts, ok := v.([]any)
	if !ok || len(parts) != 3 {
		return nil, nil, fmt.Errorf("redispool: renew: unexpected reply %v", v)
	}
	inUse, ok := parts[0].(int64)
	if !ok {
		return nil, nil, fmt.Errorf("redispool: renew: unexpected reply %v", v)
	}
	p.setStats(int(inUse))
	if lostLeases, err = strs(parts[1]); err == nil {
		lostWaiters, err = strs(parts[2])
	}
	if err != nil {
		return nil, nil, fmt.Errorf("redispool: renew: %w", err)
	}
	return lostLeases, lostWaiters, nil
}

func ints(v any, n int) ([]int64, error) {
	a, ok := v.([]any)
	if !ok || len(a) != n {
		return nil, fmt.Errorf("unexpected script reply %v", v)
	}
	out := make([]int64, n)
	for i, x := range a {
		if out[i], ok = x.(int64); !ok {
			return nil, fmt.Errorf("unexpected script reply %v", v)
		}
	}
	return out, nil
}

func strs(v any) ([]string, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected script reply %v", v)
	}
	out := make([]string, len(a))
	for i, x := range a {
		if out[i], ok = x.(string); !ok {
			return nil, fmt.Errorf("unexpected script reply %v", v)
		}
	}
	return out, nil
}

// forget files lease id of user, and waiter member if not "", for the next
// renewal round to remove from Redis (both removals are idempotent).
func (p *Pool) forget(id, user, member string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.releaseLaterLocked(id, user)
	if member != "" {
		p.orphans = append(p.orphans, member)
	}
	p.startRenewalLocked()
}
