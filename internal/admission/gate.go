package admission

import (
	"context"
	"errors"
	"time"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// GateDeps are the parts a Gate asks. Nil optional parts admit.
type GateDeps struct {
	// Limiter is the per-identity rate limit; nil limits nothing.
	Limiter *RateLimiter
	// Breaker is the provider's circuit (a *Breaker, or *Circuits with
	// several upstreams); nil never refuses.
	Breaker Circuit
	// Overflow is the queue's overflow gate; nil when there is no queue.
	Overflow *Overflow
	// Service estimates how soon a slot frees up. Required.
	Service *ServiceTime
	// Pool tells the slot capacity Service divides by. Required.
	Pool interface{ Stats() pool.Stats }
}

// Gate is the api's one admission decision (docs/OPERATIONS.md,
// "Admission"): may this request run, may it queue, must it queue behind
// others, and what Retry-After a refusal for a full pool advises. It
// implements stream.Gate. Safe for concurrent use; only Admit's rate limit
// does I/O.
type Gate struct {
	d GateDeps
}

// NewGate returns the gate over deps.
func NewGate(deps GateDeps) (*Gate, error) {
	if deps.Service == nil || deps.Pool == nil {
		return nil, errors.New("admission: gate needs a service-time estimate and a pool")
	}
	return &Gate{d: deps}, nil
}

// Admit refuses an identity over its rate limit (rate-limited), then any
// request while the provider's circuit is open (provider-unavailable).
func (g *Gate) Admit(ctx context.Context, identity string, prio protocol.Priority) *protocol.Problem {
	if g.d.Limiter != nil {
		if p := g.d.Limiter.Allow(ctx, identity); p != nil {
			return p
		}
	}
	if g.d.Breaker != nil {
		return g.d.Breaker.Check(prio)
	}
	return nil
}

// MayQueue refuses a request of priority prio for the queue while the
// backlog is over that priority's shedding level (queue-overflow).
func (g *Gate) MayQueue(prio protocol.Priority) *protocol.Problem {
	if g.d.Overflow == nil {
		return nil
	}
	return g.d.Overflow.Check(prio)
}

// QueueFirst reports jobs waiting that could use a slot a new request
// would take (docs/QUEUE.md, "Fairness"): a new request then queues behind
// them instead, so none starves. Jobs no worker has taken count only while
// every slot of the pool is in use. While slots are free those jobs are
// not waiting for a slot: they wait for a worker, which takes them as soon
// as it has room, or sit behind their own identity's per-user limit
// (workers park those and reach past them). Sending every other identity's
// request behind them would let one noisy identity hold everyone up. A job
// a worker has taken asks the pool as a waiter, and the pool itself keeps
// newer direct requests from the slots those waiters can use.
func (g *Gate) QueueFirst() bool {
	if g.d.Overflow == nil || g.d.Overflow.Waiting() == 0 {
		return false
	}
	s := g.d.Pool.Stats()
	return s.InUse >= s.Capacity
}

// RetryAfter estimates when a slot frees up, for a full pool's refusal.
func (g *Gate) RetryAfter() time.Duration {
	return g.d.Service.RetryAfter(0, g.d.Pool.Stats().Capacity)
}

// ServiceDone teaches RetryAfter how long a direct stream held its slot.
func (g *Gate) ServiceDone(d time.Duration) { g.d.Service.Observe(d) }
