package telemetry_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
	"github.com/spillway-dev/spillway/internal/testkit/oteltest"
)

// clearOTelEnv unsets every variable Setup or the SDK reads, so a test sees
// only what it sets (t.Setenv restores them afterwards, and forbids
// t.Parallel, as these globals require).
func clearOTelEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER",
		"OTEL_TRACES_SAMPLER_ARG", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED",
		"OTEL_BSP_SCHEDULE_DELAY", "OTEL_EXPORTER_OTLP_COMPRESSION",
	} {
		t.Setenv(k, "")
	}
}

// setup calls Setup and registers its shutdown as a cleanup, for tests that
// do not shut down themselves.
func setup(t *testing.T, service string, opts ...telemetry.Option) (*telemetry.Provider, func(context.Context) error) {
	t.Helper()
	p, shutdown, err := telemetry.Setup(context.Background(), service, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() { _ = shutdown(context.Background()) })
	return p, shutdown
}

func shutdownNow(t *testing.T, shutdown func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func TestSetupOffWithoutEndpoint(t *testing.T) {
	clearOTelEnv(t)
	// Variables that only tune tracing do not turn it on.
	t.Setenv("OTEL_SERVICE_NAME", "x")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	p, shutdown := setup(t, telemetry.ServiceAPI)
	if p.Enabled() {
		t.Fatal("tracing on without an OTLP endpoint")
	}
	ctx, span := p.StartAdmission(context.Background())
	if span.IsRecording() || trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("tracing off, yet a span was started")
	}
	if tc := p.InjectJob(ctx); tc != nil {
		t.Errorf("InjectJob = %+v with tracing off", tc)
	}
	base := &http.Transport{}
	if got := p.HTTPTransport(base); got != base {
		t.Error("HTTPTransport wrapped the transport with tracing off")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown of the no-op provider: %v", err)
	}

	// The middleware is a pass-through.
	gin.SetMode(gin.TestMode)
	e := gin.New()
	e.Use(p.GinMiddleware(telemetry.ServiceAPI))
	var sawSpan bool
	e.GET("/x", func(c *gin.Context) {
		sawSpan = trace.SpanContextFromContext(c.Request.Context()).IsValid()
		c.Status(http.StatusNoContent)
	})
	req := httptest.NewRequest(http.MethodGet, "/x", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	w := httptest.NewRecorder()
	e.ServeHTTP(w, req)
	if w.Code != http.StatusNoContent || sawSpan {
		t.Errorf("off middleware: status %d, span in handler %v", w.Code, sawSpan)
	}
}

func TestSetupOffSwitches(t *testing.T) {
	for name, env := range map[string][2]string{
		"OTEL_SDK_DISABLED":    {"OTEL_SDK_DISABLED", "true"},
		"OTEL_TRACES_EXPORTER": {"OTEL_TRACES_EXPORTER", "none"},
	} {
		t.Run(name, func(t *testing.T) {
			clearOTelEnv(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			t.Setenv(env[0], env[1])
			if p, _ := setup(t, telemetry.ServiceAPI); p.Enabled() {
				t.Errorf("tracing on with %s=%s", env[0], env[1])
			}
		})
	}
}

func TestSetupRejectsBadConfig(t *testing.T) {
	clearOTelEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	if _, _, err := telemetry.Setup(context.Background(), telemetry.ServiceAPI, nil); err == nil {
		t.Error("Setup accepted OTEL_EXPORTER_OTLP_PROTOCOL=carrier-pigeon")
	}
	if _, _, err := telemetry.Setup(context.Background(), "", nil); err == nil {
		t.Error("Setup accepted an empty default service name")
	}
}

// TestOffPathAllocatesNothing is the cost promise: with tracing off, every
// helper the direct path calls allocates nothing.
func TestOffPathAllocatesNothing(t *testing.T) {
	clearOTelEnv(t)
	p, _ := setup(t, telemetry.ServiceAPI)
	var nilProvider *telemetry.Provider
	hist := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h"})
	inner := &countingHandler{}
	logh := telemetry.NewLogHandler(inner)
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "msg", 0)
	job := protocol.Job{RequestID: "r", Trace: &protocol.TraceContext{TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	hdr := http.Header{}
	bg := context.Background()

	for _, p := range []*telemetry.Provider{p, nilProvider} {
		allocs := testing.AllocsPerRun(200, func() {
			ctx := bg
			telemetry.SetRequest(trace.SpanFromContext(ctx), "req-1", "high")
			ctx, adm := p.StartAdmission(ctx)
			telemetry.SetResult(adm, "admitted")
			adm.End()
			ctx, acq := p.StartPoolAcquire(ctx)
			telemetry.SetResult(acq, "acquired")
			acq.End()
			telemetry.SetPath(trace.SpanFromContext(ctx), "direct")
			cctx, call := p.StartProviderCall(ctx, "openai", "sim-1")
			p.InjectHTTP(cctx, hdr)
			telemetry.Retrying(call, "429", time.Second)
			telemetry.Reset(call, 2)
			telemetry.FirstChunk(call)
			telemetry.SetCallResult(call, telemetry.CallResult{OutputTokens: 5, FinishReason: "stop"})
			telemetry.Outcome(call, telemetry.OutcomeError, "https://spillway.dev/errors/x")
			call.End()
			telemetry.ObserveWithExemplar(cctx, hist, 0.25)
			_ = logh.Handle(cctx, rec)
			ectx, enq := p.StartEnqueue(ctx, "redis", "spillway:jobs", "req-1")
			_ = p.InjectJob(ectx)
			enq.End()
			jctx := p.ExtractJob(bg, job)
			_, js := p.StartJob(jctx, telemetry.JobInfo{RequestID: "r"})
			js.End()
		})
		if allocs != 0 {
			t.Errorf("tracing off (provider %p): %v allocations per request, want 0", p, allocs)
		}
	}
	if inner.n == 0 {
		t.Error("the log handler under test never passed a record on")
	}
}

// countingHandler is an slog.Handler that counts records and, when keep is
// set, keeps the last one's attributes (which allocates).
type countingHandler struct {
	n     int
	keep  bool
	attrs map[string]string
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.n++
	if h.keep {
		h.attrs = map[string]string{}
		r.Attrs(func(a slog.Attr) bool { h.attrs[a.Key] = a.Value.String(); return true })
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func TestSetupExportsOverHTTP(t *testing.T) {
	clearOTelEnv(t)
	rcv := oteltest.NewHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
	// Ten minutes between batches: only shutdown can deliver the span in
	// time, which is what the stop order relies on.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
	p, shutdown := setup(t, telemetry.ServiceAPI)
	if !p.Enabled() {
		t.Fatal("tracing off with OTEL_EXPORTER_OTLP_ENDPOINT set")
	}
	_, span := p.StartAdmission(context.Background())
	telemetry.SetResult(span, "admitted")
	span.End()
	shutdownNow(t, shutdown)

	got, ok := oteltest.Find(rcv.Spans(), "", telemetry.SpanAdmission)
	if !ok {
		t.Fatalf("shutdown returned before the buffered span was exported; received %v", rcv.Spans())
	}
	if got.Service != telemetry.ServiceAPI {
		t.Errorf("service.name = %q, want %q", got.Service, telemetry.ServiceAPI)
	}
	if got.Attributes["spillway.result"] != "admitted" {
		t.Errorf("attributes = %v", got.Attributes)
	}
	if id, _ := got.Resource["service.instance.id"].(string); id == "" {
		t.Errorf("resource has no service.instance.id: %v", got.Resource)
	}
}

func TestSetupServiceNameAndTracesEndpoint(t *testing.T) {
	clearOTelEnv(t)
	rcv := oteltest.NewHTTP(t)
	// The signal-specific endpoint alone turns tracing on; it is the full
	// URL, path included.
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rcv.Endpoint+"/v1/traces")
	t.Setenv("OTEL_SERVICE_NAME", "spillway-consumer-eu")
	p, shutdown := setup(t, telemetry.ServiceConsumer)
	_, span := p.StartPoolAcquire(context.Background())
	span.End()
	shutdownNow(t, shutdown)
	got, ok := oteltest.Find(rcv.Spans(), "", telemetry.SpanPoolAcquire)
	if !ok || got.Service != "spillway-consumer-eu" {
		t.Errorf("span %v (found %v), want service spillway-consumer-eu from OTEL_SERVICE_NAME", got, ok)
	}
}

func TestSetupExportsOverGRPC(t *testing.T) {
	clearOTelEnv(t)
	rcv := oteltest.NewGRPC(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	p, shutdown := setup(t, telemetry.ServiceConsumer)
	_, span := p.StartJob(context.Background(), telemetry.JobInfo{RequestID: "r1", System: "redis"})
	span.End()
	shutdownNow(t, shutdown)
	got, ok := oteltest.Find(rcv.Spans(), telemetry.ServiceConsumer, telemetry.SpanJob)
	if !ok {
		t.Fatalf("no %s span over gRPC; received %v", telemetry.SpanJob, rcv.Spans())
	}
	if got.Attributes["spillway.request_id"] != "r1" {
		t.Errorf("attributes = %v", got.Attributes)
	}
}

func TestSetupHonoursSampler(t *testing.T) {
	clearOTelEnv(t)
	rcv := oteltest.NewHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	p, shutdown := setup(t, telemetry.ServiceAPI)
	ctx, span := p.StartAdmission(context.Background())
	if span.IsRecording() || trace.SpanContextFromContext(ctx).IsSampled() {
		t.Error("span recorded and sampled under OTEL_TRACES_SAMPLER=always_off")
	}
	span.End()
	shutdownNow(t, shutdown)
	if n := len(rcv.Spans()); n != 0 {
		t.Errorf("%d spans exported under always_off", n)
	}
}

func TestShutdownReportsFailure(t *testing.T) {
	clearOTelEnv(t)
	rcv := oteltest.NewHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
	p, shutdown := setup(t, telemetry.ServiceAPI)
	_, span := p.StartAdmission(context.Background())
	span.End()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := shutdown(ctx); err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("shutdown with a cancelled context = %v, want context.Canceled", err)
	}
}
