package stream

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// The handler's part of tracing (docs/TRACING.md): the server span otelgin
// started is in the request's context; these helpers add the admission
// and pool-acquire spans and the attributes and events of the request.
// With tracing off every span here is the SDK's no-op span and nothing is
// allocated.

// tracedMetrics is implemented by metrics that attach the trace id of the
// request to first-chunk latency as an exemplar (*metrics.Metrics does).
type tracedMetrics interface {
	FirstChunkTraced(ctx context.Context, path string, d time.Duration)
}

// admit runs the gate's Admit inside a spillway.admission span.
func (h *Handler) admit(ctx context.Context, user string, prio protocol.Priority) *protocol.Problem {
	ctx, span := h.tel.StartAdmission(ctx)
	p := h.gate.Admit(ctx, user, prio)
	if span.IsRecording() {
		telemetry.SetResult(span, admissionResult(p))
		span.End()
	}
	return p
}

// admissionResult names a gate's answer for spillway.result: "admitted",
// or the slug of the problem (rate-limited, provider-unavailable, …).
func admissionResult(p *protocol.Problem) string {
	if p == nil {
		return "admitted"
	}
	return problemSlug(p)
}

func problemSlug(p *protocol.Problem) string {
	if len(p.Type) > len(protocol.ProblemTypeBase) {
		return p.Type[len(protocol.ProblemTypeBase):]
	}
	return p.Type
}

// tryAcquire takes a direct slot inside a spillway.pool.acquire span.
func (h *Handler) tryAcquire(ctx context.Context, user string) (pool.Lease, error) {
	ctx, span := h.tel.StartPoolAcquire(ctx)
	lease, err := h.pool.TryAcquire(ctx, user)
	if span.IsRecording() {
		result := "acquired"
		switch {
		case errors.Is(err, pool.ErrUserLimit):
			result = "user_limit"
		case err != nil:
			result = "full"
		}
		telemetry.SetResult(span, result)
		span.End()
	}
	return lease, err
}

// firstChunkWritten observes the first chunk written: the latency histogram, with
// the trace id as exemplar, and the first_chunk event on the server span.
func (s *session) firstChunkWritten() {
	d := time.Since(s.start)
	if tm, ok := s.h.m.(tracedMetrics); ok {
		tm.FirstChunkTraced(s.ctx, s.path, d)
	} else {
		s.h.m.FirstChunk(s.path, d)
	}
	telemetry.FirstChunk(trace.SpanFromContext(s.ctx))
}

// traceEnd adds the terminal outcome to the server span; an error outcome
// carries the problem type.
func (s *session) traceEnd(outcome string) {
	span := trace.SpanFromContext(s.ctx)
	if !span.IsRecording() {
		return
	}
	telemetry.Outcome(span, outcome, s.problemType)
}
