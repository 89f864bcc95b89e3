package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span names (docs/TRACING.md). The provider call is named
// "chat {model}", after the GenAI semantic conventions.
const (
	SpanAdmission   = "spillway.admission"
	SpanPoolAcquire = "spillway.pool.acquire"
	SpanEnqueue     = "spillway.enqueue"
	SpanQueueWait   = "spillway.queue.wait"
	SpanParked      = "spillway.stream.parked"
	SpanJob         = "spillway.job"
	spanChatPrefix  = "chat "
)

// Event names (docs/TRACING.md).
const (
	EventFirstChunk = "first_chunk"
	EventRetrying   = "retrying"
	EventReset      = "reset"
	EventOutcome    = "outcome"
)

// Attribute keys: Spillway's own, then those of the OpenTelemetry messaging
// and GenAI semantic conventions (written out, since the Go semconv
// packages leave the GenAI ones out while they are in development).
const (
	AttrPath         = attribute.Key("spillway.path")
	AttrRequestID    = attribute.Key("spillway.request_id")
	AttrPriority     = attribute.Key("spillway.priority")
	AttrQueueWaitMS  = attribute.Key("spillway.queue_wait_ms")
	AttrResult       = attribute.Key("spillway.result")
	AttrOutcome      = attribute.Key("spillway.outcome")
	AttrProblemType  = attribute.Key("spillway.problem_type")
	AttrRetryReason  = attribute.Key("spillway.retry.reason")
	AttrRetryDelayMS = attribute.Key("spillway.retry.delay_ms")
	AttrResetAttempt = attribute.Key("spillway.reset.attempt")

	AttrMessagingSystem      = attribute.Key("messaging.system")
	AttrMessagingOperation   = attribute.Key("messaging.operation.type")
	AttrMessagingDestination = attribute.Key("messaging.destination.name")

	AttrGenAIOperation     = attribute.Key("gen_ai.operation.name")
	AttrGenAISystem        = attribute.Key("gen_ai.system")
	AttrGenAIProvider      = attribute.Key("gen_ai.provider.name")
	AttrGenAIRequestModel  = attribute.Key("gen_ai.request.model")
	AttrGenAIResponseModel = attribute.Key("gen_ai.response.model")
	AttrGenAIInputTokens   = attribute.Key("gen_ai.usage.input_tokens")
	AttrGenAIOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")
	AttrGenAIFinishReasons = attribute.Key("gen_ai.response.finish_reasons")
)

// OutcomeError is the outcome that sets a span's status to Error.
const OutcomeError = "error"

// noopSpan is what every helper returns with tracing off: the SDK's shared
// non-recording span, whose methods do nothing and allocate nothing.
var noopSpan = trace.SpanFromContext(context.Background())

// StartAdmission starts spillway.admission, around the rate-limit and
// overflow checks of one request. End it with SetResult.
func (p *Provider) StartAdmission(ctx context.Context) (context.Context, trace.Span) {
	if !p.Enabled() {
		return ctx, noopSpan
	}
	return p.tracer.Start(ctx, SpanAdmission)
}

// StartParked starts spillway.stream.parked, the rest of a queued stream
// whose handler returned while it waited (its server span ends then): the
// stream's later events and its outcome go on it. End it when the stream
// ends. The context it returns is not cancelled with the request's.
func (p *Provider) StartParked(ctx context.Context) (context.Context, trace.Span) {
	ctx = context.WithoutCancel(ctx)
	if !p.Enabled() {
		return ctx, noopSpan
	}
	return p.tracer.Start(ctx, SpanParked)
}

// StartPoolAcquire starts spillway.pool.acquire, around taking a provider
// slot (or waiting for one, in a worker). End it with SetResult.
func (p *Provider) StartPoolAcquire(ctx context.Context) (context.Context, trace.Span) {
	if !p.Enabled() {
		return ctx, noopSpan
	}
	return p.tracer.Start(ctx, SpanPoolAcquire)
}

// StartEnqueue starts spillway.enqueue, a producer span around handing the
// job to the queue. Inject the returned context into the job (InjectJob)
// so the consumer's spans become children of this one. system is
// messaging.system ("redis" or "kafka"), destination the stream or topic.
func (p *Provider) StartEnqueue(ctx context.Context, system, destination, requestID string) (context.Context, trace.Span) {
	if !p.Enabled() {
		return ctx, noopSpan
	}
	return p.tracer.Start(ctx, SpanEnqueue, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(
		AttrMessagingSystem.String(system),
		AttrMessagingOperation.String("send"),
		AttrMessagingDestination.String(destination),
		AttrRequestID.String(requestID),
	))
}

// JobInfo describes a job a worker has taken, for StartJob.
type JobInfo struct {
	RequestID   string
	Priority    string    // "" when the job has none
	System      string    // messaging.system: "redis" or "kafka"
	Destination string    // the stream or topic read
	EnqueueTime time.Time // protocol.Job.EnqueueTime
	Started     time.Time // when the worker took the job; zero means now
}

// StartJob records spillway.queue.wait, from the job's enqueue time to the
// worker taking it, and starts spillway.job, the consumer span of the
// job's processing. ctx should come from ExtractJob, so both are children
// of the api's spillway.enqueue span; without a parent they start a new
// trace. The job span carries spillway.queue_wait_ms.
func (p *Provider) StartJob(ctx context.Context, j JobInfo) (context.Context, trace.Span) {
	if !p.Enabled() {
		return ctx, noopSpan
	}
	started := j.Started
	if started.IsZero() {
		started = time.Now()
	}
	wait := started.Sub(j.EnqueueTime)
	if j.EnqueueTime.IsZero() || wait < 0 {
		// Clocks of api and worker disagree, or no enqueue time: a
		// negative or epoch-long wait would mislead.
		wait = 0
	}
	waitMS := AttrQueueWaitMS.Int64(wait.Milliseconds())
	if wait > 0 {
		_, w := p.tracer.Start(ctx, SpanQueueWait, trace.WithTimestamp(j.EnqueueTime),
			trace.WithAttributes(AttrRequestID.String(j.RequestID), waitMS))
		w.End(trace.WithTimestamp(started))
	}
	attrs := []attribute.KeyValue{
		AttrMessagingSystem.String(j.System),
		AttrMessagingOperation.String("process"),
		AttrMessagingDestination.String(j.Destination),
		AttrRequestID.String(j.RequestID),
		waitMS,
	}
	if j.Priority != "" {
		attrs = append(attrs, AttrPriority.String(j.Priority))
	}
	return p.tracer.Start(ctx, SpanJob, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(started), trace.WithAttributes(attrs...))
}

// StartProviderCall starts "chat {model}", the client span of one call to
// the upstream, with the GenAI attributes gen_ai.operation.name (chat),
// gen_ai.system and gen_ai.provider.name (system, e.g. "openai"), and
// gen_ai.request.model. Finish it with SetCallResult and the events below,
// then End it. One span per call, never one per chunk.
func (p *Provider) StartProviderCall(ctx context.Context, system, model string) (context.Context, trace.Span) {
	if !p.Enabled() {
		return ctx, noopSpan
	}
	return p.tracer.Start(ctx, spanChatPrefix+model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		AttrGenAIOperation.String("chat"),
		AttrGenAISystem.String(system),
		AttrGenAIProvider.String(system),
		AttrGenAIRequestModel.String(model),
	))
}

// CallResult is what a provider call reported at its end.
type CallResult struct {
	ResponseModel string // "" when the upstream did not say
	InputTokens   int    // 0 when the upstream sent no usage
	OutputTokens  int
	FinishReason  string // "stop", "length", …; "" when none
}

// SetCallResult puts the usage and finish reason of a provider call on its
// span: gen_ai.response.model, gen_ai.usage.input_tokens and output_tokens,
// gen_ai.response.finish_reasons.
func SetCallResult(span trace.Span, r CallResult) {
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 4)
	if r.ResponseModel != "" {
		attrs = append(attrs, AttrGenAIResponseModel.String(r.ResponseModel))
	}
	if r.InputTokens > 0 {
		attrs = append(attrs, AttrGenAIInputTokens.Int(r.InputTokens))
	}
	attrs = append(attrs, AttrGenAIOutputTokens.Int(r.OutputTokens))
	if r.FinishReason != "" {
		attrs = append(attrs, AttrGenAIFinishReasons.StringSlice([]string{r.FinishReason}))
	}
	span.SetAttributes(attrs...)
}

// SetResult records how an admission or pool-acquire step ended
// (spillway.result, e.g. "admitted", "rate_limited", "acquired", "full").
func SetResult(span trace.Span, result string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrResult.String(result))
}

// SetRequest puts the request id and priority on span, normally the server
// span of the request (trace.SpanFromContext of the handler's context).
// priority may be "".
func SetRequest(span trace.Span, requestID, priority string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrRequestID.String(requestID))
	if priority != "" {
		span.SetAttributes(AttrPriority.String(priority))
	}
}

// SetPath records the path a request took, "direct" or "queued".
func SetPath(span trace.Span, path string) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrPath.String(path))
}

// FirstChunk adds the first_chunk event: the first piece of the answer
// arrived (on a provider call or job span) or was written (on the server
// span).
func FirstChunk(span trace.Span) {
	if !span.IsRecording() {
		return
	}
	span.AddEvent(EventFirstChunk)
}

// Retrying adds the retrying event: the call failed before its first chunk
// for reason (e.g. "429", "503", "first_chunk_timeout") and is tried again
// after delay.
func Retrying(span trace.Span, reason string, delay time.Duration) {
	if !span.IsRecording() {
		return
	}
	span.AddEvent(EventRetrying, trace.WithAttributes(
		AttrRetryReason.String(reason), AttrRetryDelayMS.Int64(delay.Milliseconds())))
}

// Reset adds the reset event: the chunks so far are void and attempt
// starts again (the SSE reset event).
func Reset(span trace.Span, attempt int) {
	if !span.IsRecording() {
		return
	}
	span.AddEvent(EventReset, trace.WithAttributes(AttrResetAttempt.Int(attempt)))
}

// Outcome adds the terminal outcome event and the spillway.outcome
// attribute (the outcome label values of spillway_streams_total and
// spillway_worker_jobs_total). On OutcomeError the span's status becomes
// Error with the problem type as its description, and spillway.problem_type
// is set; problemType is the problem document's type URI, never internal
// error text.
func Outcome(span trace.Span, outcome, problemType string) {
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{AttrOutcome.String(outcome)}
	if problemType != "" {
		attrs = append(attrs, AttrProblemType.String(problemType))
	}
	span.AddEvent(EventOutcome, trace.WithAttributes(attrs...))
	span.SetAttributes(attrs...)
	if outcome == OutcomeError {
		span.SetStatus(codes.Error, problemType)
	}
}
