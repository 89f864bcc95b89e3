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
	// slot wait, so the queue timeout no longer applies. The cancel check
	// and then it run while the worker asks for its slot, so neither
	// delays the provider call; every later result waits for it.
	gone, firstBeat := w.checkThenBeat(ctx, jobCtx, job.RequestID, d, pub)
	var beats sync.WaitGroup
	beats.Go(func() { w.heartbeat(jobCtx, d, pub) })

	if d.Attempt > 1 {
		telemetry.Reset(span, d.Attempt)
		pub.send(jobCtx, protocol.Result{Kind: protocol.KindReset, Reset: &protocol.Reset{Attempt: d.Attempt}})
	}
	outcome, reason := w.answer(jobCtx, job, d, pub, gone)
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

// checkThenBeat asks whether the job's client is gone (its cancel key,
// docs/QUEUE.md, "Cancellation") and then publishes the first heartbeat
// unless it is, on a goroutine of its own: the check overlaps the slot
// wait instead of preceding it, and the heartbeat the provider call. A
// client gone before start cancels the job (jobCtx) with errClientGone,
// and nothing is published. gone waits for the check and reports whether
// the client is gone (a check that failed runs the job); beat waits for
// the heartbeat too. A delivery whose backend already looked up the
// cancel key (d.CancelChecked: next.lua on a single Redis) is not asked
// about again: its answer is the check's.
func (w *Worker) checkThenBeat(ctx, jobCtx context.Context, requestID string, d failover.Delivery, pub *publisher) (gone func() bool, beat func()) {
	checked := make(chan struct{})
	var left bool
	beat = pub.sendAsync(jobCtx, protocol.Result{Kind: protocol.KindHeartbeat}, func() bool {
		defer close(checked)
		g := d.Cancelled
		if !d.CancelChecked {
			var err error
			g, err = w.deps.Cancels.Cancelled(ctx, requestID)
			if err != nil {
				pub.log.Warn("cancel check failed; running the job", "err", err)
			}
		}
		if g {
			left = true
			pub.log.Info("client gone before start; job skipped")
			pub.cancel(errClientGone)
		}
		return !g
	})
	return func() bool {
		<-checked
		return left
	}, beat
}

// answer waits for a slot and streams the answer with retries. It returns
// the job outcome and, for a dead letter, the reason. The provider is
// called only once the cancel check (gone) found the client there.
func (w *Worker) answer(ctx context.Context, job protocol.Job, d failover.Delivery, pub *publisher, gone func() bool) (string, string) {
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
	if gone() {
		return OutcomeCancelled, ""
	}
	w.queueWaited(ctx, time.Since(job.EnqueueTime))
	return w.stream(ctx, job, pub)
}
