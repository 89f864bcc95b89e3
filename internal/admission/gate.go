package admission

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Circuit is what the Gate asks before it admits a request: how long the
// provider's circuit still refuses every call, 0 while it takes calls. A
// *breaker.Breaker is one; *breaker.Circuits, the breakers of several
// upstreams, another (internal/llm/breaker). It must read memory only:
// the gate asks it on every request.
type Circuit interface {
	OpenFor() time.Duration
}

// GateDeps are the parts a Gate asks. Nil optional parts admit.
type GateDeps struct {
	// Limiter is the per-identity rate limit; nil limits nothing.
	Limiter *RateLimiter
	// Circuit is the provider's circuit; nil never refuses. With one,
	// Metrics is required.
	Circuit Circuit
	// Metrics counts the circuit's refusals in
	// spillway_queue_rejections_total{reason="circuit_open",priority}.
	Metrics *metrics.Metrics
	// Overflow is the queue's overflow gate; nil when there is no queue.
	Overflow *Overflow
	// Degrader is the degradation level; nil never refuses or caps.
	Degrader *Degrader
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
	d       GateDeps
	refused [3]prometheus.Counter // circuit refusals by Priority.Rank
}

// NewGate returns the gate over deps.
func NewGate(deps GateDeps) (*Gate, error) {
	if deps.Service == nil || deps.Pool == nil {
		return nil, errors.New("admission: gate needs a service-time estimate and a pool")
	}
	g := &Gate{d: deps}
	if deps.Circuit != nil {
		if deps.Metrics == nil {
			return nil, errors.New("admission: gate with a circuit needs metrics")
		}
		for _, prio := range protocol.Priorities {
			g.refused[prio.Rank()] = deps.Metrics.QueueRejections.WithLabelValues("circuit_open", string(prio))
		}
	}
	return g, nil
}

// Admit refuses an identity over its rate limit (rate-limited), then any
// request while the provider's circuit is open (provider-unavailable),
// then the priorities the degradation level turns away (queue-overflow:
// low from level 2, all but high at level 3).
func (g *Gate) Admit(ctx context.Context, identity string, prio protocol.Priority) *protocol.Problem {
	if g.d.Limiter != nil {
		if p := g.d.Limiter.Allow(ctx, identity); p != nil {
			return p
		}
	}
	if g.d.Circuit != nil {
		if p := g.circuitOpen(prio); p != nil {
			return p
		}
	}
	if g.d.Degrader != nil {
		return g.d.Degrader.Check(prio)
	}
	return nil
}

// circuitOpen returns nil while the provider's circuit takes calls, else
// a 503 provider-unavailable problem whose Retry-After is the time the
// circuit has left open, counted in
// spillway_queue_rejections_total{reason="circuit_open",priority}.
func (g *Gate) circuitOpen(prio protocol.Priority) *protocol.Problem {
	left := g.d.Circuit.OpenFor()
	if left == 0 {
		return nil
	}
	g.refused[prio.Rank()].Inc()
	return protocol.ProviderUnavailable(protocol.RetryAfterSeconds(left))
}

// MaxTokens is the cap on an admitted request's max_tokens at the current
// degradation level, 0 for none (DEGRADE_MAX_TOKENS for normal from
// level 2).
func (g *Gate) MaxTokens(prio protocol.Priority) int {
	if g.d.Degrader == nil {
		return 0
	}
	return g.d.Degrader.MaxTokens(prio)
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
	return s.InUse >= s.Effective()
}

// RetryAfter estimates when a slot frees up, for a full pool's refusal:
// the slots that may be in use now (the adaptive limit) serve the line.
func (g *Gate) RetryAfter() time.Duration {
	return g.d.Service.RetryAfter(0, g.d.Pool.Stats().Effective())
}

// ServiceDone teaches RetryAfter how long a direct stream held its slot.
func (g *Gate) ServiceDone(d time.Duration) { g.d.Service.Observe(d) }
