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
	// Breaker is the provider's circuit; nil never refuses.
	Breaker *Breaker
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

// QueueFirst reports jobs waiting for a worker: a new request then queues
// behind them instead of taking a freed slot, so none starves.
func (g *Gate) QueueFirst() bool {
	return g.d.Overflow != nil && g.d.Overflow.Waiting() > 0
}

// RetryAfter estimates when a slot frees up, for a full pool's refusal.
func (g *Gate) RetryAfter() time.Duration {
	return g.d.Service.RetryAfter(0, g.d.Pool.Stats().Capacity)
}

// ServiceDone teaches RetryAfter how long a direct stream held its slot.
func (g *Gate) ServiceDone(d time.Duration) { g.d.Service.Observe(d) }
