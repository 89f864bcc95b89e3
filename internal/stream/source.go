package stream

import (
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// source is what feeds a session its frames: the direct path's provider
// call (directProducer) or a queue relay (relaySource). A session has one
// at a time and one loop that reads it (session.loop); the direct path's
// hand-off to the queue swaps the source under that loop rather than
// relaying the queue's frames through a second one (docs/API.md,
// "Hand-off to the queue").
type source struct {
	// frames is read until a terminal frame. A source that closes it
	// without one either ended wrongly or, when next gives one, handed
	// the request on.
	frames <-chan protocol.Result
	// done, of a relay, closes when the relay gave up; its Problem then
	// says why. nil for the direct call.
	done <-chan struct{}
	// relay, when the source is one, is closed by the session when the
	// stream ends (session.release), telling it whether the answer was
	// complete.
	relay failover.Relay
	// next, once frames closed without a terminal frame, gives the
	// source that goes on from there; nil when none may.
	next successor
}

// successor gives the source that goes on from one whose frames closed
// without a terminal frame (directProducer.handed): false when none does.
// The caller then owns the new source's relay. It is called on the
// session's goroutine, after it saw frames closed.
type successor interface {
	handed() (source, bool)
}

// relaySource is the source of a queue relay: what the workers publish.
func relaySource(r failover.Relay) source {
	return source{frames: r.Results(), done: r.Done(), relay: r}
}
