package admission

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Circuit is what the Gate asks before it admits a request: nil, or the
// 503 provider-unavailable problem while the provider cannot take calls.
// A *Breaker is one; *Circuits, the breakers of several upstreams, is
// another.
type Circuit interface {
	Check(prio protocol.Priority) *protocol.Problem
}

var (
	_ Circuit = (*Breaker)(nil)
	_ Circuit = (*Circuits)(nil)
)

// Circuits are the circuit breakers of several upstreams, one each
// (docs/UPSTREAMS.md, "Health"). One upstream's open circuit only takes
// that upstream out of routing; the provider as a whole fails fast only
// while every circuit is open, so Check refuses only then, with the
// Retry-After of the circuit that turns half-open first. Safe for
// concurrent use.
type Circuits struct {
	bs      []*Breaker
	refused [3]prometheus.Counter // by Priority.Rank
}

// NewCircuits returns the set of bs (at least one). Its refusals count in
// spillway_queue_rejections_total{reason="circuit_open"} like a single
// breaker's.
func NewCircuits(m *metrics.Metrics, bs ...*Breaker) (*Circuits, error) {
	if m == nil || len(bs) == 0 {
		return nil, errors.New("admission: circuits need metrics and at least one breaker")
	}
	c := &Circuits{bs: bs}
	for _, prio := range protocol.Priorities {
		c.refused[prio.Rank()] = m.QueueRejections.WithLabelValues("circuit_open", string(prio))
	}
	return c, nil
}

// Check returns nil while some circuit takes calls (closed, half-open, or
// its open time over), else a 503 provider-unavailable problem whose
// Retry-After is the shortest time a circuit has left open. It reads
// atomics only, as Breaker.Check does.
func (c *Circuits) Check(prio protocol.Priority) *protocol.Problem {
	var soonest time.Duration
	for _, b := range c.bs {
		left := b.OpenFor()
		if left == 0 {
			return nil
		}
		if soonest == 0 || left < soonest {
			soonest = left
		}
	}
	c.refused[prio.Rank()].Inc()
	return protocol.ProviderUnavailable(protocol.RetryAfterSeconds(soonest))
}
