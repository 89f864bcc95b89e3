package redispool

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/rediserr"
)

// Judging Redis (docs/OPERATIONS.md, "Redis busy or down"). A Redis that
// answers late is busy, not gone: a fork for a snapshot, an fsync, a slow
// script or a starved CPU make any one call miss its deadline. Only what
// shows Redis is gone switches the Pool to the fallback pool:
//
//   - an error that says the connection is gone: refused, reset, closed by
//     the server (EOF), broken pipe, no route; or a reply saying the server
//     cannot serve at all (LOADING, MASTERDOWN, CLUSTERDOWN, READONLY,
//     max clients, OOM);
//   - or no answer to the health probe (a PING on a connection of its own,
//     Config.Probe) for Config.DownAfter, counted from the first call that
//     timed out.
//
// A call that timed out (or found the client's connection pool exhausted,
// or a BUSY script) is a *slowError: the call fails alone — a direct
// request is told the pool is exhausted and goes to the queue, a waiter
// tries again on the dispatcher's next pass — and the probe starts
// watching. The first probe answer ends the suspicion.

// unavailableError marks a call that failed because Redis is gone; it
// switches the Pool to the fallback pool at once.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// slowError marks a call that Redis did not answer in time; it starts the
// health probe, nothing more.
type slowError struct{ err error }

func (e *slowError) Error() string { return e.err.Error() }
func (e *slowError) Unwrap() error { return e.err }

// Health probe timing.
const (
	// DefaultDownAfter is the default Config.DownAfter
	// (REDIS_DOWN_AFTER_MS=3000).
	DefaultDownAfter = 3 * time.Second
	// probeTimeout bounds one health probe; probeGap separates two.
	probeTimeout = time.Second
	probeGap     = 250 * time.Millisecond
)

// suspect starts the health watch after a call that timed out, unless it
// already runs or the Pool is in fallback. It returns a channel closed
// when the watch has a first verdict: Redis answered, or is gone.
func (p *Pool) suspect(cause error) (verdict <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.suspecting {
		return p.verdict
	}
	if fb, _ := p.mode(); fb {
		return closedChan
	}
	v := make(chan struct{})
	if !p.goLocked(func() { p.watch(cause, v) }) {
		return closedChan
	}
	p.suspecting, p.slowSince, p.verdict = true, time.Now(), v
	return v
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// awaitVerdict waits a moment for the health watch's first verdict after a
// direct call timed out: a Redis that is gone (a refused dial that the
// client retried into a timeout) then serves this call from the fallback
// pool instead of failing it.
func (p *Pool) awaitVerdict(ctx context.Context, verdict <-chan struct{}) {
	t := time.NewTimer(probeGap)
	defer t.Stop()
	select {
	case <-verdict:
	case <-t.C:
	case <-ctx.Done():
	case <-p.closing:
	}
}

// watch probes Redis until it answers (busy: nothing happens), or shows it
// is gone, or gives no answer for DownAfter since the slow call: then the
// Pool switches to the fallback pool.
func (p *Pool) watch(cause error, verdict chan struct{}) {
	once := sync.OnceFunc(func() { close(verdict) })
	defer func() {
		p.mu.Lock()
		p.suspecting = false
		p.mu.Unlock()
		once()
	}()
	p.mu.Lock()
	deadline := p.slowSince.Add(p.cfg.DownAfter)
	p.mu.Unlock()
	for {
		left := time.Until(deadline)
		ctx, cancel := context.WithTimeout(context.Background(), min(probeTimeout, max(left, probeGap)))
		err := p.probeOnce(ctx)
		cancel()
		switch {
		case err == nil:
			p.log.Debug("redispool: Redis slow but answering; staying on the distributed pool", "cause", cause)
			return
		case rediserr.Classify(err) == rediserr.Gone:
			p.setFallback(true, err)
			return
		}
		once() // no answer yet: callers waiting for a verdict go on
		if !time.Now().Before(deadline) {
			p.setFallback(true, errors.Join(cause, errors.New("no answer to the health probe for "+p.cfg.DownAfter.String())))
			return
		}
		t := time.NewTimer(min(probeGap, max(time.Until(deadline), time.Millisecond)))
		select {
		case <-p.closing:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// probeOnce is one health probe: Config.Probe, or a PING on the Pool's
// probe client.
func (p *Pool) probeOnce(ctx context.Context) error {
	if p.cfg.Probe != nil {
		return p.cfg.Probe(ctx)
	}
	return p.prober.Ping(ctx).Err()
}

// ProbeOptions turns the options of a client into those of its health
// probe: one connection, never idle, no retries, one dial attempt, so the
// probe reports at once what it finds (a refused dial is not retried into
// a timeout).
func ProbeOptions(o *redis.Options) *redis.Options {
	c := *o
	c.PoolSize, c.MinIdleConns, c.MaxIdleConns = 1, 0, 1
	c.MaxRetries, c.DialerRetries = -1, 1
	c.ContextTimeoutEnabled = true
	return &c
}

// ClientOptions gives the options of the pool's main client (a node's, in
// a Cluster) the dial retries the pool needs: two attempts 50 ms apart and
// the call's deadline on the socket, so that a refused dial shows as
// refused within a call's timeout rather than being retried into a
// timeout that reads as a busy Redis (docs/OPERATIONS.md, "Redis busy or
// down"), and a call made as Redis went down does not run on it once it
// is back. It changes o and returns it.
func ClientOptions(o *redis.Options) *redis.Options {
	o.DialerRetries, o.DialerRetryTimeout = clientDialRetries, clientDialRetryPause
	o.ContextTimeoutEnabled = true
	return o
}

// The main client's dial retries (ClientOptions).
const (
	clientDialRetries    = 2
	clientDialRetryPause = 50 * time.Millisecond
)

// newProber returns the client the default probe PINGs: for a single
// *redis.Client a copy on its own connection (ProbeOptions), closed by
// Close; for other clients the client itself.
func newProber(rdb redis.UniversalClient) (prober redis.UniversalClient, closeIt func()) {
	if c, ok := rdb.(*redis.Client); ok {
		pc := redis.NewClient(ProbeOptions(c.Options()))
		return pc, func() { _ = pc.Close() }
	}
	return rdb, func() {}
}
