package failover

import (
	"context"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Spiller is the queued path as the HTTP layer sees it (package gateway
// implements it). Implementations are safe for concurrent use.
//
// Spill subscribes to the job's result channel, waits for the subscription
// to be confirmed, then enqueues the job. It returns a Relay only once the
// queue accepted the job; on failure it returns a *protocol.Problem (for
// example queue-unavailable) to send as the refusal, or another error, and
// nothing stays subscribed.
type Spiller interface {
	Spill(ctx context.Context, job protocol.Job) (Relay, error)
}

// Relay carries one queued request's results back to its handler.
//
// Results delivers decoded results in order. Done is closed when the relay
// ends on its own (subscription lost, worker silent too long, wait
// exceeded); Problem then says what to tell the client. Close ends the
// relay: it unsubscribes and, when the answer was not complete
// (completed false), tells the workers the client is gone so the job is
// skipped or its provider call cancelled. Close is idempotent.
type Relay interface {
	Results() <-chan protocol.Result
	Done() <-chan struct{}
	Problem() *protocol.Problem
	Close(completed bool)
}
