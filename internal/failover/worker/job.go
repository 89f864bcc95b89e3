package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// handle answers one delivery and settles it: ack, dead-letter, or (when
// the worker stops mid-job or lost its claim) nothing, so another worker
// takes it over. It reports whether it stopped on a lost claim.
func (w *Worker) handle(ctx context.Context, d failover.Delivery) (claimLost bool) {
	job, err := protocol.DecodeJob(d.Body)
	if err != nil {
		w.m.MalformedMessage("queue")
		w.log.Warn("malformed job dead-lettered", "delivery", d.ID, "err", err)
		w.settle(ctx, d, "", OutcomeDeadLetter, "malformed job: "+err.Error())
		return false
	}
	ctx, span := w.startJob(ctx, &job, d)
	defer span.End()
	log := withTrace(w.log.With("request_id", job.RequestID, "attempt", d.Attempt, "priority", job.Priority.OrNormal()), span)
	gone, err := w.deps.Cancels.Cancelled(ctx, job.RequestID)
	if err != nil {
		log.Warn("cancel check failed; running the job", "err", err)
	}
	if gone {
		log.Info("client gone before start; job skipped")
		w.settle(ctx, d, job.RequestID, OutcomeCancelled, "")
		return false
	}
	now := time.Now()
	if d.Attempt <= 1 && now.After(job.Deadline) {
		log.Info("job expired before start; skipped", "waited", now.Sub(job.EnqueueTime).String())
		w.settle(ctx, d, job.RequestID, OutcomeExpired, "")
		return false
	}

	jobCtx, cancel := context.WithCancelCause(ctx)
	forget := w.cancels.track(job.RequestID, cancel)
	pub := w.newPublisher(d, job.RequestID, cancel, log)
	// The first heartbeat tells the api a worker has the job, before the
	// slot wait, so the queue timeout no longer applies. It goes out while
	// the worker asks for its slot, one round trip fewer before the
	// provider is called; every later result waits for it.
	firstBeat := pub.sendAsync(jobCtx, protocol.Result{Kind: protocol.KindHeartbeat})
	var beats sync.WaitGroup
	beats.Go(func() { w.heartbeat(jobCtx, d, pub) })

	if d.Attempt > 1 {
		telemetry.Reset(span, d.Attempt)
		pub.send(jobCtx, protocol.Result{Kind: protocol.KindReset, Reset: &protocol.Reset{Attempt: d.Attempt}})
	}
	outcome, reason := w.answer(jobCtx, job, d, pub)
	firstBeat()
	// Stop order of one job: the cause is read first (cancelling sets no
	// cause once one is set), then the heartbeat stops before the job is
	// settled, so no heartbeat follows DONE or ERROR, and the cancel watch
	// forgets the job.
	cause := context.Cause(jobCtx)
	cancel(nil)
	beats.Wait()
	forget()
	switch {
	case errors.Is(cause, errStopping):
		log.Warn("worker stopped mid-job; left for takeover")
		return false
	case errors.Is(cause, errClaimLost):
		return true
	case errors.Is(cause, errPublishFailed):
		outcome = OutcomeError
	}
	w.settle(ctx, d, job.RequestID, outcome, reason)
	return false
}

// answer waits for a slot and streams the answer with retries. It returns
// the job outcome and, for a dead letter, the reason.
func (w *Worker) answer(ctx context.Context, job protocol.Job, d failover.Delivery, pub *publisher) (string, string) {
	lease, err := w.waitSlotTraced(ctx, job, d)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return OutcomeCancelled, ""
		}
		pub.log.Warn("no pool slot before the deadline", "err", err)
		pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.QueueTimeout(retryAfterSeconds)})
		return OutcomeExpired, ""
	}
	defer lease.Release()
	w.queueWaited(ctx, time.Since(job.EnqueueTime))
	return w.stream(ctx, job, pub)
}
