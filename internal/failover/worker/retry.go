package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// retryAfterSeconds is the Retry-After a job's client is advised when the
// worker ends its stream with an error it may retry (provider failed, no
// slot in time).
const retryAfterSeconds = 2

// backoffJitter and backoffMultiplier shape the provider retries between
// BaseDelay and MaxDelay: each delay doubles, ±50%.
const (
	backoffJitter     = 0.5
	backoffMultiplier = 2
)

// circuitOpen is an error from a provider behind a circuit breaker that
// refused the call without making it (admission's Breaker returns one).
// Found by errors.As, so the worker needs no import of the breaker.
type circuitOpen interface {
	error
	CircuitOpen() bool
}

// isCircuitOpen reports whether err says the provider's circuit is open.
func isCircuitOpen(err error) bool {
	var co circuitOpen
	return errors.As(err, &co) && co.CircuitOpen()
}

// stream calls the provider and publishes the answer, retrying with
// exponential backoff while nothing reached the client, and waiting out an
// open circuit without spending retries. It returns the job outcome and,
// for a dead letter, the reason.
func (w *Worker) stream(ctx context.Context, job protocol.Job, pub *publisher) (string, string) {
	bo := &backoff.ExponentialBackOff{
		InitialInterval: w.cfg.BaseDelay, RandomizationFactor: backoffJitter, Multiplier: backoffMultiplier,
		MaxInterval: w.cfg.MaxDelay,
	}
	bo.Reset()
	var circuitWait time.Duration // waited on an open circuit, bounded by QueueTimeout
	for attempt := 0; ; {
		b := newBatcher(pub, w.cfg.BatchSize, w.cfg.BatchTimeout)
		res, err := w.deps.Provider.Stream(ctx, job.Payload, func(content string) error { return b.add(ctx, content) })
		if err == nil {
			b.flush(ctx)
			usage := res.Usage
			pub.send(ctx, protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{
				RequestID: job.RequestID, FinishReason: res.FinishReason, Path: protocol.PathQueued, Usage: &usage,
			}})
			return OutcomeDone, ""
		}
		if ctx.Err() != nil {
			return OutcomeCancelled, ""
		}
		// Chunks still in the batch never reached the client: dropping them
		// keeps a retry invisible to it.
		if b.discard() > 0 {
			// Chunks reached the client: a retry would repeat them.
			pub.log.Warn("provider failed mid-answer", "err", err)
			pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderFailed(retryAfterSeconds)})
			return OutcomeError, ""
		}
		var le *llm.Error
		if isCircuitOpen(err) && errors.As(err, &le) {
			// The provider is known to be down: wait for the circuit to
			// half-open instead of burning retries, as long as a client
			// would wait for a queued job to start.
			wait := max(le.RetryAfter, w.cfg.BaseDelay)
			if circuitWait+wait > w.cfg.QueueTimeout {
				pub.log.Warn("provider circuit stayed open; giving up", "waited", circuitWait.String())
				pub.send(ctx, protocol.Result{Kind: protocol.KindError,
					Problem: protocol.ProviderUnavailable(int(w.cfg.QueueTimeout / time.Second))})
				return OutcomeError, ""
			}
			circuitWait += wait
			pub.log.Info("provider circuit open; waiting", "wait", wait.String())
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return OutcomeCancelled, ""
			}
		}
		if !llm.IsRetryable(err) || attempt >= w.cfg.MaxRetries {
			pub.log.Error("provider failed; dead-lettering", "retries", attempt, "err", err)
			pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderFailed(retryAfterSeconds)})
			return OutcomeDeadLetter, fmt.Sprintf("provider failed after %d retries: %v", attempt, err)
		}
		attempt++
		delay := min(bo.NextBackOff(), w.cfg.MaxDelay) // jitter may exceed MaxInterval
		if errors.As(err, &le) && le.RetryAfter > delay {
			delay = min(le.RetryAfter, w.cfg.MaxDelay)
		}
		w.m.Retried()
		traceRetrying(ctx, err, delay)
		pub.log.Info("provider failed; retrying", "retry", attempt, "delay", delay.String(), "err", err)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return OutcomeCancelled, ""
		}
	}
}
