// Package telemetry owns Spillway's OpenTelemetry tracing: the tracer
// provider built from the standard OTEL_* variables, W3C trace-context
// propagation over HTTP, the job message and Kafka headers, the spans and
// attributes docs/TRACING.md lists, trace ids in log lines, and trace-id
// exemplars on Prometheus histograms.
//
// Tracing is off unless an OTLP endpoint is configured; then every helper
// here returns at once without allocating, so the direct path pays nothing.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/spillway-dev/spillway/internal/redact"
)

// Default service names (OTEL_SERVICE_NAME overrides them).
const (
	ServiceAPI      = "spillway-api"
	ServiceConsumer = "spillway-consumer"
)

// instrumentationName names Spillway's own tracer, as the instrumentation
// scope of every span this package starts.
const instrumentationName = "github.com/spillway-dev/spillway/internal/telemetry"

// The variables that turn tracing on; any other OTEL_* variable only tunes
// it once it is on.
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envSDKDisabled    = "OTEL_SDK_DISABLED"
)

// Provider is a process's tracing: the tracer provider, the W3C propagator
// and the helpers that start Spillway's spans. A nil *Provider, and the one
// Setup returns when tracing is off, start no span and allocate nothing.
// It is safe for concurrent use.
type Provider struct {
	on      bool
	tp      trace.TracerProvider
	tracer  trace.Tracer
	prop    propagation.TextMapPropagator
	metrics Metrics
	log     *slog.Logger
}

// Option tunes Setup.
type Option func(*options)

type options struct {
	metrics Metrics
}

// WithMetrics makes the Provider count trace fields it could not use
// (spillway_trace_context_invalid_total); without it they are not counted.
func WithMetrics(m Metrics) Option {
	return func(o *options) {
		if m != nil {
			o.metrics = m
		}
	}
}

// Setup builds the process's tracing from the standard OTEL_* variables
// alone (docs/TRACING.md). Tracing is off, and the returned Provider a
// no-op, unless OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (and OTEL_SDK_DISABLED is not
// true, and OTEL_TRACES_EXPORTER is not none). When on, spans go out over
// OTLP (OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf by default, or grpc) in
// batches (OTEL_BSP_*), sampled by OTEL_TRACES_SAMPLER (parent-based
// always-on by default); the service name is OTEL_SERVICE_NAME, else
// serviceDefault; and the W3C tracecontext and baggage propagator becomes
// the global one, which otelhttp and otelgin use.
//
// The caller must call shutdown last in its stop order, after everything
// that may still end a span has stopped: it flushes the spans still
// buffered, bounded by its context. An invalid OTEL_* value is an error.
func Setup(ctx context.Context, serviceDefault string, log *slog.Logger, opts ...Option) (p *Provider, shutdown func(context.Context) error, err error) {
	if serviceDefault == "" {
		return nil, nil, errors.New("telemetry: Setup needs a default service name")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	off := &Provider{tp: noop.NewTracerProvider(), log: log, metrics: o.metrics}
	off.tracer = off.tp.Tracer(instrumentationName)
	off.prop = w3cPropagator()
	noShutdown := func(context.Context) error { return nil }

	if os.Getenv(envEndpoint) == "" && os.Getenv(envTracesEndpoint) == "" {
		log.Debug("telemetry: tracing off, no OTLP endpoint set")
		return off, noShutdown, nil
	}
	if strings.EqualFold(strings.TrimSpace(os.Getenv(envSDKDisabled)), "true") {
		log.Info("telemetry: tracing off, " + envSDKDisabled + " is true")
		return off, noShutdown, nil
	}

	// autoexport reads OTEL_TRACES_EXPORTER and the OTLP protocol, endpoint,
	// headers, compression and timeout variables.
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: span exporter from OTEL_* variables: %w", err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		log.Info("telemetry: tracing off, OTEL_TRACES_EXPORTER is none")
		return off, noShutdown, nil
	}

	res, err := newResource(ctx, serviceDefault)
	if err != nil {
		// A detector that fails (no host name, no cgroup) leaves its
		// attributes out; the service name is still there.
		log.Warn("telemetry: resource detection incomplete", "err", err)
	}
	// No sampler option and WithBatcher: the SDK then reads
	// OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_* itself.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))

	p = &Provider{on: true, tp: tp, tracer: tp.Tracer(instrumentationName), prop: off.prop, metrics: o.metrics, log: log}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(p.prop)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		// Export failures: the collector is down or refuses; requests go on.
		// Its text may quote the endpoint, password and all.
		log.Warn("telemetry: export", "err", redact.Text(err.Error()))
	}))
	log.Info("telemetry: tracing on", "service", serviceName(res))

	shutdown = func(ctx context.Context) error {
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("telemetry: flush and shut down tracer provider: %w", err)
		}
		return nil
	}
	return p, shutdown, nil
}

// newResource describes the process: the default service name, overridden
// by OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES (later detectors win), a
// fresh service.instance.id so one consumer is told from another, and the
// host, process runtime and container id.
func newResource(ctx context.Context, serviceDefault string) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithService(),
		resource.WithAttributes(attribute.String("service.name", serviceDefault)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithProcessRuntimeName(),
		resource.WithProcessRuntimeVersion(),
		resource.WithContainerID(),
	)
	if err != nil && res == nil {
		return resource.NewSchemaless(attribute.String("service.name", serviceDefault)),
			fmt.Errorf("telemetry: resource: %w", err)
	}
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return res, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, err
}

func serviceName(res *resource.Resource) string {
	v, _ := res.Set().Value("service.name")
	return v.AsString()
}

// w3cPropagator is the W3C tracecontext and baggage propagator, the only
// one Spillway speaks on every hop.
func w3cPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Enabled reports whether spans are recorded and exported.
func (p *Provider) Enabled() bool {
	return p != nil && p.on
}

// TracerProvider returns the provider to hand to other instrumentation; a
// no-op one when tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil || p.tp == nil {
		return noop.NewTracerProvider()
	}
	return p.tp
}

// Propagator returns the W3C tracecontext and baggage propagator.
func (p *Provider) Propagator() propagation.TextMapPropagator {
	if p == nil || p.prop == nil {
		return w3cPropagator()
	}
	return p.prop
}
