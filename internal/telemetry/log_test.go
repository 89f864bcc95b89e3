package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/telemetry"
)

// spanContext returns ctx holding the incoming test span, sampled or not.
func spanContext(sampled bool) context.Context {
	tid, _ := trace.TraceIDFromHex(incomingTraceID)
	sid, _ := trace.SpanIDFromHex(incomingSpanID)
	var flags trace.TraceFlags
	if sampled {
		flags = trace.FlagsSampled
	}
	return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: flags,
	}))
}

func TestLogHandlerAddsTraceIDs(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(telemetry.NewLogHandler(slog.NewJSONHandler(&buf, nil))).With("request_id", "req-1")
	tests := []struct {
		name   string
		ctx    context.Context
		wantID bool
	}{
		{"sampled span", spanContext(true), true},
		// A span that is not sampled still names a trace the api's
		// parent may have recorded; the ids stay useful.
		{"unsampled span", spanContext(false), true},
		{"no span", context.Background(), false},
	}
	for _, tt := range tests {
		buf.Reset()
		log.InfoContext(tt.ctx, "hello", "n", 1)
		var line map[string]any
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
			t.Fatalf("%s: log line %q: %v", tt.name, buf.String(), err)
		}
		if line["request_id"] != "req-1" || line["n"] != 1.0 {
			t.Errorf("%s: the record's own attributes were lost: %v", tt.name, line)
		}
		if tt.wantID {
			if line["trace_id"] != incomingTraceID || line["span_id"] != incomingSpanID {
				t.Errorf("%s: trace_id %v span_id %v, want %s %s", tt.name, line["trace_id"], line["span_id"], incomingTraceID, incomingSpanID)
			}
		} else if _, ok := line["trace_id"]; ok {
			t.Errorf("%s: trace_id %v without a span", tt.name, line["trace_id"])
		}
	}
}

func TestLogHandlerKeepsLevelAndGroups(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := telemetry.NewLogHandler(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if h.Enabled(context.Background(), slog.LevelInfo) {
		t.Error("Enabled(Info) under a Warn handler")
	}
	log := slog.New(h).WithGroup("g")
	log.WarnContext(spanContext(true), "x", "k", "v")
	var line struct {
		G map[string]any `json:"g"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	if line.G["k"] != "v" || line.G["trace_id"] != incomingTraceID {
		t.Errorf("grouped line %s", buf.Bytes())
	}
}

func TestLogHandlerNoSpanAllocatesNothing(t *testing.T) {
	inner := &countingHandler{}
	h := telemetry.NewLogHandler(inner)
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "m", 0)
	r.AddAttrs(slog.String("request_id", "req-1"))
	ctx := context.Background()
	if allocs := testing.AllocsPerRun(1000, func() { _ = h.Handle(ctx, r) }); allocs != 0 {
		t.Errorf("Handle without a span: %v allocations, want 0", allocs)
	}
	// With a span, the ids reach the inner handler and the caller's record
	// keeps only its own attribute.
	inner.keep = true
	if err := h.Handle(spanContext(true), r); err != nil {
		t.Fatal(err)
	}
	if inner.attrs["trace_id"] != incomingTraceID || inner.attrs["span_id"] != incomingSpanID {
		t.Errorf("inner handler got %v", inner.attrs)
	}
	if r.NumAttrs() != 1 {
		t.Errorf("the caller's record has %d attributes after Handle, want 1", r.NumAttrs())
	}
}
