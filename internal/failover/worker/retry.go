package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// retryAfterSeconds is the Retry-After a job's client is advised when the
// worker ends its stream with an error it may retry (provider failed, no
// slot in time), unless the provider advised a longer one.
const retryAfterSeconds = 2

// reasonCircuitOpen is the reason label of a wait on an open circuit, in
// spillway_worker_retries_total and the `retrying` event.
const reasonCircuitOpen = "circuit_open"

// stream calls the provider and publishes the answer, retrying while
// nothing reached the client (docs/QUEUE.md, "Retries"; docs/TIMEOUTS.md):
//
//   - a client error (llm.IsClientError: the upstream refused this
//     request's content) ends the stream with provider-rejected at once:
//     never retried, never dead-lettered;
//   - an open circuit is waited out without spending retries;
//   - any other retryable failure waits Config.Retry's delay (an upstream
//     Retry-After honoured up to LLM_RETRY_AFTER_MAX_SECONDS), at most
//     MaxRetries times, then the job is dead-lettered.
//
// Before each wait the client is told with a `retrying` event. All waits
// of one job together are bounded by QueueTimeout, as long as a client
// waits for a queued job to start: a wait that would pass it ends the job
// now instead. It returns the job outcome and, for a dead letter, the
// reason.
func (w *Worker) stream(ctx context.Context, job protocol.Job, pub *publisher) (string, string) {
	var waited time.Duration // every wait so far, bounded by QueueTimeout
	retries := 0             // retries spent, bounded by MaxRetries
	// Whom the call is for, to a provider that routes or orders calls by
	// it (several upstreams: affinity, and the turn of a call waiting for
	// an upstream slot, as for a pool slot).
	callCtx := llm.WithCaller(ctx, llm.Caller{Identity: job.UserID, Session: job.SessionID, Since: job.EnqueueTime})
	for call := 1; ; call++ {
		b := newBatcher(pub, w.cfg.BatchSize, w.cfg.BatchTimeout)
		route := job.Payload.Route
		res, err := w.deps.Provider.Stream(callCtx, job.Payload, func(c protocol.Chunk) error {
			if !c.NeededBy(route) {
				return nil
			}
			return b.add(ctx, c.For(route))
		})
		if err == nil {
			usage := res.Usage
			if !b.finish(ctx, protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{
				RequestID: job.RequestID, FinishReason: res.FinishReason, Path: protocol.PathQueued, Usage: &usage,
			}}) {
				return OutcomeCancelled, "" // cancelled as the call ended: no DONE
			}
			w.ended(nil)
			return OutcomeDone, ""
		}
		if ctx.Err() != nil {
			b.discard() // a batch still being published ends before the job does
			return OutcomeCancelled, ""
		}
		// Chunks still in the batch never reached the client: dropping them
		// keeps a retry invisible to it.
		if b.discard() > 0 {
			// Chunks reached the client: a retry would repeat them.
			pub.log.Warn("provider failed mid-answer", "err", err)
			pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderFailed(retryAfterSeconds)})
			w.ended(err)
			return OutcomeError, ""
		}
		var le *llm.Error
		if llm.IsClientError(err) && errors.As(err, &le) {
			// Another try, or a replay from the dead letters, would meet
			// the same refusal: the client is told now.
			pub.log.Info("provider refused the request", "status", le.Status, "err", err)
			pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderRejected(le.Status, le.Body)})
			w.ended(err)
			return OutcomeError, ""
		}

		var wait time.Duration
		reason := reasonCircuitOpen
		if llm.IsCircuitOpen(err) && errors.As(err, &le) {
			// The provider is known to be down: wait for the circuit to
			// half-open instead of burning retries.
			wait = max(le.RetryAfter, w.cfg.baseDelay())
			if waited+wait > w.cfg.QueueTimeout {
				pub.log.Warn("provider circuit stayed open; giving up", "waited", waited.String())
				pub.send(ctx, protocol.Result{Kind: protocol.KindError,
					Problem: protocol.ProviderUnavailable(int(w.cfg.QueueTimeout / time.Second))})
				w.ended(err)
				return OutcomeError, ""
			}
		} else {
			delay, retryable := w.cfg.Retry.Delay(err, retries+1)
			advise := max(retryAfterSeconds, protocol.RetryAfterSeconds(delay))
			switch {
			case !retryable || retries >= w.cfg.MaxRetries:
				pub.log.Error("provider failed; dead-lettering", "retries", retries, "err", err)
				pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderFailed(advise)})
				w.ended(err)
				return OutcomeDeadLetter, fmt.Sprintf("provider failed after %d retries: %v", retries, err)
			case waited+delay > w.cfg.QueueTimeout:
				pub.log.Error("provider retry would wait past the queue timeout; dead-lettering",
					"retries", retries, "waited", waited.String(), "delay", delay.String(), "err", err)
				pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderFailed(advise)})
				w.ended(err)
				return OutcomeDeadLetter, fmt.Sprintf("provider failed after %d retries (next wait %s past the queue timeout): %v",
					retries, delay, err)
			}
			retries++
			wait, reason = delay, llm.Reason(err)
		}
		waited += wait
		w.m.Retried(reason)
		traceRetrying(ctx, reason, wait)
		pub.log.Info("provider failed; retrying", "call", call+1, "wait", wait.String(), "reason", reason, "err", err)
		pub.send(ctx, protocol.Result{Kind: protocol.KindRetrying, Retrying: &protocol.Retrying{
			Attempt: call + 1, RetryInSeconds: wait.Seconds(), Reason: reason,
		}})
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return OutcomeCancelled, ""
		}
	}
}

// ended tells Deps.Ended how a job's request ended (err nil: answered).
func (w *Worker) ended(err error) {
	if w.deps.Ended != nil {
		w.deps.Ended(err)
	}
}
