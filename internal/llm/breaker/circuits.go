package breaker

import (
	"errors"
	"time"
)

// Circuits are the circuit breakers of several upstreams, one each
// (docs/UPSTREAMS.md, "Health"). One upstream's open circuit only takes
// that upstream out of routing; the provider as a whole fails fast only
// while every circuit is open, so OpenFor is non-zero only then. Safe for
// concurrent use.
type Circuits struct {
	bs []*Breaker
}

// NewCircuits returns the set of bs (at least one).
func NewCircuits(bs ...*Breaker) (*Circuits, error) {
	if len(bs) == 0 {
		return nil, errors.New("breaker: circuits need at least one breaker")
	}
	return &Circuits{bs: bs}, nil
}

// OpenFor returns 0 while some circuit takes calls (closed, half-open, or
// its open time over), else the shortest time a circuit has left open:
// when the provider as a whole takes calls again. It reads atomics only,
// as Breaker.OpenFor does.
func (c *Circuits) OpenFor() time.Duration {
	var soonest time.Duration
	for _, b := range c.bs {
		left := b.OpenFor()
		if left == 0 {
			return 0
		}
		if soonest == 0 || left < soonest {
			soonest = left
		}
	}
	return soonest
}
