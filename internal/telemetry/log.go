package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Log keys of the trace ids.
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// LogHandler is an slog.Handler that adds trace_id and span_id to every
// record logged with a context holding a valid span, so a log line leads to
// its trace (docs/TRACING.md). A record without one passes through
// untouched and without allocating.
type LogHandler struct {
	inner slog.Handler
}

var _ slog.Handler = LogHandler{}

// NewLogHandler wraps inner. Use it around the process's JSON handler and
// log with the request's context (logger.InfoContext(ctx, …)).
func NewLogHandler(inner slog.Handler) LogHandler {
	return LogHandler{inner: inner}
}

// Enabled reports whether inner handles records of level.
func (h LogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// Handle adds the trace ids of ctx's span, if any, and passes r on. The ids
// go where r's other attributes go, so after WithGroup they are inside the
// group.
func (h LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			// r is this handler's copy; Clone keeps the caller's record
			// intact should it hand the same one to another handler.
			r = r.Clone()
			r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
		}
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs returns a LogHandler around inner.WithAttrs(attrs).
func (h LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return LogHandler{inner: h.inner.WithAttrs(attrs)}
}

// WithGroup returns a LogHandler around inner.WithGroup(name).
func (h LogHandler) WithGroup(name string) slog.Handler {
	return LogHandler{inner: h.inner.WithGroup(name)}
}
