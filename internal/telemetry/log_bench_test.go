package telemetry_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/telemetry"
)

// BenchmarkLogHandler measures what the trace-id wrapper adds to a record:
// nothing without a span, two hex ids with one.
func BenchmarkLogHandler(b *testing.B) {
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "m", 0)
	r.AddAttrs(slog.String("request_id", "req-1"))
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{
		{"no_span", context.Background()},
		{"span", spanContext(true)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := telemetry.NewLogHandler(&countingHandler{})
			b.ReportAllocs()
			for b.Loop() {
				_ = h.Handle(bc.ctx, r)
			}
		})
	}
}
