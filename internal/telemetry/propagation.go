package telemetry

import (
	"context"
	"net/http"

	kafka "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Metrics is what the Provider counts. Implementations must be safe for
// concurrent use.
type Metrics interface {
	// TraceContextInvalid counts one trace field that was present but could
	// not be used (spillway_trace_context_invalid_total): its job or record
	// ran without a parent span.
	TraceContextInvalid()
}

func (p *Provider) countInvalid() {
	if p.metrics != nil {
		p.metrics.TraceContextInvalid()
	}
}

// The W3C header names, which are also the carrier keys the propagator
// asks for.
const (
	keyTraceParent = "traceparent"
	keyTraceState  = "tracestate"
	keyBaggage     = "baggage"
)

// JobCarrier carries a trace context in a job's trace field
// (protocol.TraceContext). It implements propagation.TextMapCarrier.
type JobCarrier struct {
	TC *protocol.TraceContext
}

var _ propagation.TextMapCarrier = JobCarrier{}

// Get returns the value of key, or "".
func (c JobCarrier) Get(key string) string {
	switch key {
	case keyTraceParent:
		return c.TC.TraceParent
	case keyTraceState:
		return c.TC.TraceState
	case keyBaggage:
		return c.TC.Baggage
	}
	return ""
}

// Set stores value under key; keys other than the W3C three are ignored,
// since the job has no room for them.
func (c JobCarrier) Set(key, value string) {
	switch key {
	case keyTraceParent:
		c.TC.TraceParent = value
	case keyTraceState:
		c.TC.TraceState = value
	case keyBaggage:
		c.TC.Baggage = value
	}
}

// Keys lists the keys that hold a value.
func (c JobCarrier) Keys() []string {
	var keys []string
	for _, k := range []string{keyTraceParent, keyTraceState, keyBaggage} {
		if c.Get(k) != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// InjectJob returns the trace context to put in the Trace field of a job
// enqueued under ctx (inside the spillway.enqueue span, so the consumer's
// spans become its children), or nil when tracing is off or ctx carries
// neither a span nor baggage. A tracestate or baggage longer than the job
// allows is left out, so DecodeJob never drops what this wrote.
func (p *Provider) InjectJob(ctx context.Context) *protocol.TraceContext {
	if !p.Enabled() || !hasContext(ctx) {
		return nil
	}
	tc := &protocol.TraceContext{}
	p.prop.Inject(ctx, JobCarrier{tc})
	return fitJob(tc)
}

// fitJob trims tc to the bounds of protocol.TraceContext.Validate, keeping
// the traceparent, which alone continues the trace.
func fitJob(tc *protocol.TraceContext) *protocol.TraceContext {
	if tc.Validate() != nil {
		tc.TraceState, tc.Baggage = "", ""
	}
	if tc.IsZero() || tc.Validate() != nil {
		return nil
	}
	return tc
}

func hasContext(ctx context.Context) bool {
	return trace.SpanContextFromContext(ctx).IsValid() || baggage.FromContext(ctx).Len() > 0
}

// ExtractJob returns ctx carrying the remote span context (and baggage) of
// j's trace field, so the spans the worker starts from it join the api's
// trace. A trace field DecodeJob dropped, or whose traceparent does not
// parse, never fails the job: ctx comes back without a parent, so the job's
// spans start a new trace, and spillway_trace_context_invalid_total counts
// it. With tracing off it returns ctx as it is.
func (p *Provider) ExtractJob(ctx context.Context, j protocol.Job) context.Context {
	if !p.Enabled() {
		return ctx
	}
	if j.TraceDropped {
		p.countInvalid()
		return ctx
	}
	if j.Trace == nil {
		return ctx
	}
	return p.extract(ctx, JobCarrier{j.Trace}, j.Trace.TraceParent != "")
}

// extract runs the propagator on carrier and counts a traceparent that was
// there but did not yield a span context. A bad tracestate or baggage is
// ignored by the propagator without failing the traceparent, so it is not
// counted.
func (p *Provider) extract(ctx context.Context, carrier propagation.TextMapCarrier, hasParent bool) context.Context {
	before := trace.SpanContextFromContext(ctx)
	out := p.prop.Extract(ctx, carrier)
	if hasParent {
		after := trace.SpanContextFromContext(out)
		if !after.IsValid() || after.Equal(before) {
			p.countInvalid()
		}
	}
	return out
}

// KafkaCarrier carries a trace context in Kafka record headers. It
// implements propagation.TextMapCarrier; Set replaces a header of the same
// key rather than adding a second one.
type KafkaCarrier struct {
	Headers *[]kafka.Header
}

var _ propagation.TextMapCarrier = KafkaCarrier{}

// Get returns the value of the first header named key, or "".
func (c KafkaCarrier) Get(key string) string {
	for _, h := range *c.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set stores value in the header named key.
func (c KafkaCarrier) Set(key, value string) {
	for i, h := range *c.Headers {
		if h.Key == key {
			(*c.Headers)[i].Value = []byte(value)
			return
		}
	}
	*c.Headers = append(*c.Headers, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys lists the header names.
func (c KafkaCarrier) Keys() []string {
	keys := make([]string, 0, len(*c.Headers))
	for _, h := range *c.Headers {
		keys = append(keys, h.Key)
	}
	return keys
}

// InjectKafka returns headers with the W3C trace headers of ctx added,
// within the bounds a job's trace field keeps. With tracing off, or no span
// in ctx, it returns headers unchanged.
func (p *Provider) InjectKafka(ctx context.Context, headers []kafka.Header) []kafka.Header {
	tc := p.InjectJob(ctx)
	if tc == nil {
		return headers
	}
	return appendKafkaHeaders(headers, tc)
}

// ExtractKafka is ExtractJob for a record's headers: ctx carrying the remote
// span context they hold; headers out of bounds or that do not parse give
// ctx back without a parent and are counted.
func (p *Provider) ExtractKafka(ctx context.Context, headers []kafka.Header) context.Context {
	if !p.Enabled() {
		return ctx
	}
	tc, dropped := TraceFromKafkaHeaders(headers)
	return p.ExtractJob(ctx, protocol.Job{Trace: tc, TraceDropped: dropped})
}

func appendKafkaHeaders(headers []kafka.Header, tc *protocol.TraceContext) []kafka.Header {
	c := KafkaCarrier{&headers}
	for _, k := range []string{keyTraceParent, keyTraceState, keyBaggage} {
		if v := (JobCarrier{tc}).Get(k); v != "" {
			c.Set(k, v)
		}
	}
	return headers
}

// TraceFromKafkaHeaders reads the trace context of a record's headers into
// the form of a job's trace field, under the same bounds as DecodeJob: the
// Kafka queue sets Job.Trace and Job.TraceDropped from it, so the worker
// treats both queues alike. It returns nil, false when there is none, and
// nil, true when the headers hold one out of bounds.
func TraceFromKafkaHeaders(headers []kafka.Header) (tc *protocol.TraceContext, dropped bool) {
	var t protocol.TraceContext
	c := KafkaCarrier{&headers}
	for _, k := range []string{keyTraceParent, keyTraceState, keyBaggage} {
		(JobCarrier{&t}).Set(k, c.Get(k))
	}
	if t.IsZero() {
		return nil, false
	}
	if t.Validate() != nil {
		return nil, true
	}
	out := t
	return &out, false
}

// InjectHTTP writes the W3C trace headers of ctx into h, for a client that
// builds its own requests to the upstream; HTTPTransport does this and more.
// Nothing happens with tracing off.
func (p *Provider) InjectHTTP(ctx context.Context, h http.Header) {
	if !p.Enabled() || !hasContext(ctx) {
		return
	}
	p.prop.Inject(ctx, propagation.HeaderCarrier(h))
}
