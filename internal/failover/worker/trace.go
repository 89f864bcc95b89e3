package worker

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// The worker's part of tracing (docs/TRACING.md): the job span, a child
// of the api's enqueue span through the job's trace field (or the Kafka
// record's headers), with the slot wait, retries, reset and outcome on it.
// With tracing off every span here is the SDK's no-op span.

// tracedMetrics is implemented by metrics that attach the trace id of the
// job to its queue wait as an exemplar (*metrics.Metrics does).
type tracedMetrics interface {
	QueueWaitedTraced(ctx context.Context, d time.Duration)
}

// startJob continues the job's trace and starts its spillway.job span. A
// trace field that was dropped or does not parse is counted and the job
// runs as the root of a new trace.
func (w *Worker) startJob(ctx context.Context, job *protocol.Job, d failover.Delivery) (context.Context, trace.Span) {
	if !w.deps.Tracing.Enabled() {
		return ctx, trace.SpanFromContext(ctx)
	}
	if job.Trace == nil && !job.TraceDropped {
		// A backend that carries the context beside the body (Kafka).
		job.Trace, job.TraceDropped = d.Trace, d.TraceDropped
	}
	ctx = w.deps.Tracing.ExtractJob(ctx, *job)
	return w.deps.Tracing.StartJob(ctx, telemetry.JobInfo{
		RequestID: job.RequestID, System: w.cfg.QueueSystem, Destination: w.cfg.QueueName,
		EnqueueTime: job.EnqueueTime, Priority: string(job.Priority),
	})
}

// withTrace adds the job span's trace_id and span_id to log, so every line
// the job logs, with or without its context, leads to its trace.
func withTrace(log *slog.Logger, span trace.Span) *slog.Logger {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return log
	}
	return log.With(telemetry.LogTraceID, sc.TraceID().String(), telemetry.LogSpanID, sc.SpanID().String())
}

// waitSlotTraced is waitSlot inside a spillway.pool.acquire span.
func (w *Worker) waitSlotTraced(ctx context.Context, job protocol.Job, d failover.Delivery) (pool.Lease, error) {
	sctx, span := w.deps.Tracing.StartPoolAcquire(ctx)
	lease, err := w.waitSlot(sctx, job, d)
	if span.IsRecording() {
		result := "acquired"
		if err != nil {
			result = "timeout"
		}
		telemetry.SetResult(span, result)
		span.End()
	}
	return lease, err
}

// queueWaited observes the job's queue wait, with its trace id as exemplar.
func (w *Worker) queueWaited(ctx context.Context, d time.Duration) {
	if tm, ok := w.m.(tracedMetrics); ok {
		tm.QueueWaitedTraced(ctx, d)
		return
	}
	w.m.QueueWaited(d)
}

// traceRetrying adds the retrying event to the job span: why, and the
// wait before the next call.
func traceRetrying(ctx context.Context, reason string, delay time.Duration) {
	telemetry.Retrying(trace.SpanFromContext(ctx), reason, delay)
}

// traceOutcome adds the job's terminal outcome to its span.
func traceOutcome(ctx context.Context, outcome string) {
	telemetry.Outcome(trace.SpanFromContext(ctx), outcome, "")
}
