package metrics

import (
	"context"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// The methods below let *Metrics stand for the small metrics interfaces
// components declare where they use them.

// QueueRejected counts a request of priority prio refused instead of
// queued, by reason.
func (m *Metrics) QueueRejected(reason string, prio protocol.Priority) {
	m.QueueRejections.WithLabelValues(reason, string(prio.OrNormal())).Inc()
}

// MalformedMessage counts a queue or result message skipped, by source.
func (m *Metrics) MalformedMessage(source string) { m.MalformedMessages.WithLabelValues(source).Inc() }

// SubscriptionLost counts a result subscription that ended on its own.
func (m *Metrics) SubscriptionLost(reason string) { m.SubscriptionsLost.WithLabelValues(reason).Inc() }

// ResultDropped counts a result message the api's relay did not pass on,
// by reason (stale_attempt, duplicate).
func (m *Metrics) ResultDropped(reason string) { m.ResultsDropped.WithLabelValues(reason).Inc() }

// StreamGap counts a gap in a queued answer's sequence once it closed, by
// outcome (healed, broken).
func (m *Metrics) StreamGap(outcome string) { m.StreamGaps.WithLabelValues(outcome).Inc() }

// JobSettled counts a job a worker finished, by outcome.
func (m *Metrics) JobSettled(outcome string) { m.WorkerJobs.WithLabelValues(outcome).Inc() }

// Retried counts a provider call a worker retried, by why the last one
// failed (llm.Reason, or circuit_open).
func (m *Metrics) Retried(reason string) { m.WorkerRetries.WithLabelValues(reason).Inc() }

// UpstreamKnown shows upstream in spillway_upstream_responses_total
// (its code="200" series at 0) before its first call.
func (m *Metrics) UpstreamKnown(upstream string) {
	m.UpstreamResponses.WithLabelValues(upstream, "200")
}

// UpstreamResponded counts a provider call to upstream that got a
// response, by its HTTP status (llm.ResponseCode).
func (m *Metrics) UpstreamResponded(upstream, code string) {
	m.UpstreamResponses.WithLabelValues(upstream, code).Inc()
}

// QueueWaited observes how long a job waited from enqueue to a slot.
func (m *Metrics) QueueWaited(d time.Duration) { m.QueueWait.Observe(d.Seconds()) }

// PoolRefused counts a TryAcquire refusal by limit (global, user).
func (m *Metrics) PoolRefused(limit string) { m.PoolRefusals.WithLabelValues(limit).Inc() }

// StreamOpened counts an SSE stream open on path until the returned func
// is called.
func (m *Metrics) StreamOpened(path string) (closed func()) {
	g := m.ActiveStreams.WithLabelValues(path)
	g.Inc()
	return g.Dec
}

// StreamEnded counts a finished or refused stream by path and outcome.
func (m *Metrics) StreamEnded(path, outcome string) {
	m.StreamsTotal.WithLabelValues(path, outcome).Inc()
}

// FirstChunk observes request arrival to first chunk written on path.
func (m *Metrics) FirstChunk(path string, d time.Duration) {
	m.TimeToFirstChunk.WithLabelValues(path).Observe(d.Seconds())
}

// TraceContextInvalid counts a trace field that was present but unusable
// (telemetry.Metrics).
func (m *Metrics) TraceContextInvalid() { m.TraceInvalid.Inc() }

// QueueWaitedTraced is QueueWaited with the trace id of ctx's sampled span
// as an exemplar (docs/TRACING.md).
func (m *Metrics) QueueWaitedTraced(ctx context.Context, d time.Duration) {
	telemetry.ObserveWithExemplar(ctx, m.QueueWait, d.Seconds())
}

// FirstChunkTraced is FirstChunk with the trace id of ctx's sampled span
// as an exemplar (docs/TRACING.md).
func (m *Metrics) FirstChunkTraced(ctx context.Context, path string, d time.Duration) {
	telemetry.ObserveWithExemplar(ctx, m.TimeToFirstChunk.WithLabelValues(path), d.Seconds())
}
