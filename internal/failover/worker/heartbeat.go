package worker

import (
	"context"
	"errors"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// heartbeat publishes SIGNAL:HEARTBEAT and refreshes the queue claim every
// Heartbeat until ctx ends (docs/QUEUE.md, "Liveness"). A claim another
// worker took over cancels the job with errClaimLost; so does a claim not
// refreshed for about ReclaimIdle minus one heartbeat (the publisher's fence, fenceAfter),
// since by then another worker may hold the job.
func (w *Worker) heartbeat(ctx context.Context, d failover.Delivery, pub *publisher) {
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			err := w.deps.Consumer.Touch(ctx, d)
			if err == nil {
				pub.claimRefreshed()
			}
			if err != nil && ctx.Err() == nil {
				if errors.Is(err, failover.ErrClaimLost) {
					// Another worker took the job over (this one stalled past
					// the reclaim time): it answers now, this one stops.
					pub.log.Warn("job taken over by another worker; stopping", "err", err)
					pub.cancel(errClaimLost)
					return
				}
				pub.log.Warn("could not refresh the job's claim", "err", err)
			}
			if err := pub.send(ctx, protocol.Result{Kind: protocol.KindHeartbeat}); errors.Is(err, errFenced) {
				return
			}
		}
	}
}
