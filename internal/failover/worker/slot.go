package worker

import (
	"context"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// waitSlot waits for a pool slot for job: until the job's deadline on
// first delivery, for QueueTimeout more when the job was taken over (its
// client has been waiting already, and was told so by a reset).
func (w *Worker) waitSlot(ctx context.Context, job protocol.Job, d failover.Delivery) (pool.Lease, error) {
	deadline := job.Deadline
	if d.Attempt > 1 {
		deadline = time.Now().Add(w.cfg.QueueTimeout)
	}
	slotCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if qp, ok := w.deps.Pool.(pool.Queued); ok {
		// Slots go to jobs in the order they were queued, not the order
		// this process's goroutines reach the pool.
		return qp.AcquireSince(slotCtx, job.UserID, job.EnqueueTime)
	}
	return w.deps.Pool.Acquire(slotCtx, job.UserID)
}
