package worker

import (
	"context"
	"errors"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
)

// settleTimeout bounds acknowledging or dead-lettering one job.
const settleTimeout = 5 * time.Second

// settle acknowledges d, or dead-letters it for reason when the outcome is
// OutcomeDeadLetter, on a context of its own, so a cancelled job is still
// settled (docs/QUEUE.md, "Dead letters").
func (w *Worker) settle(ctx context.Context, d failover.Delivery, requestID, outcome, reason string) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var err error
	if outcome == OutcomeDeadLetter {
		err = w.deps.Consumer.DeadLetter(sctx, d, reason)
	} else {
		err = w.deps.Consumer.Ack(sctx, d)
	}
	switch {
	case errors.Is(err, failover.ErrClaimLost):
		// This worker stalled past the reclaim time and another one
		// took the job over: settling it is the successor's to do.
		w.log.Warn("job taken over by another worker before it was settled; left to it", "request_id", requestID,
			"outcome", outcome, "err", err)
	case err != nil:
		w.log.Error("could not settle job; it will be redelivered", "request_id", requestID, "outcome", outcome, "err", err)
	}
	w.m.JobSettled(outcome)
	traceOutcome(ctx, outcome)
}
