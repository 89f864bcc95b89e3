package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	kafka "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
	"github.com/spillway-dev/spillway/internal/testkit/kafkatest"
	"github.com/spillway-dev/spillway/internal/testkit/oteltest"
)

// The browser's span, as an incoming W3C traceparent.
const (
	incomingTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	incomingSpanID  = "00f067aa0ba902b7"
	incomingParent  = "00-" + incomingTraceID + "-" + incomingSpanID + "-01"
)

// upstream is an OpenAI-compatible stand-in that records the traceparent of
// each call.
type upstream struct {
	*httptest.Server
	traceparents chan string
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{traceparents: make(chan string, 16)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.traceparents <- r.Header.Get("traceparent")
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) traceparent(t *testing.T) string {
	t.Helper()
	select {
	case tp := <-u.traceparents:
		return tp
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream was never called")
		return ""
	}
}

// callProvider is what the llm client does with tracing: a "chat {model}"
// span around the call, the request through the traced transport, events
// and the result on the span.
func callProvider(t *testing.T, p *telemetry.Provider, ctx context.Context, url string) {
	t.Helper()
	ctx, call := p.StartProviderCall(ctx, "openai", "sim-1")
	defer call.End()
	client := &http.Client{Transport: p.HTTPTransport(nil)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("upstream call: %v", err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("upstream body: %v", err)
	}
	telemetry.FirstChunk(call)
	telemetry.SetCallResult(call, telemetry.CallResult{InputTokens: 3, OutputTokens: 1, FinishReason: "stop"})
	telemetry.Outcome(call, "done", "")
}

// gateway is a stand-in for the api's stream handler: the spans it starts
// and the job it enqueues, in the order the real one does.
func gateway(t *testing.T, api *telemetry.Provider, path, system string, up *upstream, enqueued chan<- protocol.Job) *gin.Engine {
	gin.SetMode(gin.TestMode)
	e := gin.New()
	e.Use(api.GinMiddleware(telemetry.ServiceAPI))
	e.POST("/v1/stream", func(c *gin.Context) {
		ctx := c.Request.Context()
		server := trace.SpanFromContext(ctx)
		telemetry.SetRequest(server, "req-1", "high")
		_, adm := api.StartAdmission(ctx)
		telemetry.SetResult(adm, "admitted")
		adm.End()
		_, acq := api.StartPoolAcquire(ctx)
		telemetry.SetPath(server, path)
		if path == "direct" {
			telemetry.SetResult(acq, "acquired")
			acq.End()
			callProvider(t, api, ctx, up.URL)
			telemetry.Outcome(server, "done", "")
			c.Status(http.StatusOK)
			return
		}
		telemetry.SetResult(acq, "full")
		acq.End()
		ectx, enq := api.StartEnqueue(ctx, system, "spillway:jobs", "req-1")
		now := time.Now()
		j := protocol.Job{
			RequestID: "req-1", UserID: "u",
			Payload:     protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "hi"}}},
			EnqueueTime: now, Deadline: now.Add(time.Minute),
			Trace: api.InjectJob(ectx),
		}
		enq.End()
		enqueued <- j
		c.Status(http.StatusOK)
	})
	return e
}

// worker is a stand-in for the consumer: it continues the job's trace and
// calls the provider.
func worker(t *testing.T, consumer *telemetry.Provider, j protocol.Job, system string, up *upstream) {
	ctx := consumer.ExtractJob(context.Background(), j)
	ctx, span := consumer.StartJob(ctx, telemetry.JobInfo{
		RequestID: j.RequestID, Priority: "high", System: system, Destination: "spillway:jobs", EnqueueTime: j.EnqueueTime,
	})
	callProvider(t, consumer, ctx, up.URL)
	telemetry.Outcome(span, "done", "")
	span.End()
}

// viaRedis carries j as the Redis Streams queue does: the job's wire form,
// trace field included.
func viaRedis(t *testing.T, j protocol.Job) protocol.Job {
	t.Helper()
	b, err := protocol.EncodeJob(j)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"traceparent":"00-`) {
		t.Fatalf("the job on the wire carries no traceparent: %s", b)
	}
	got, err := protocol.DecodeJob(b)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// viaKafka carries j as the Kafka queue is to: the trace context in record
// headers rather than the value, through a real (kfake) broker.
func viaKafka(t *testing.T, j protocol.Job) protocol.Job {
	t.Helper()
	cluster := kafkatest.Start(t, kfake.DefaultNumPartitions(1))
	headers := telemetry.KafkaHeaders(j.Trace)
	j.Trace = nil
	value, err := protocol.EncodeJob(j)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(cluster.Brokers...), Topic: "jobs", BatchTimeout: 5 * time.Millisecond, AllowAutoTopicCreation: true}
	defer w.Close()
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(j.RequestID), Value: value, Headers: headers}); err != nil {
		t.Fatalf("kafka write: %v", err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: cluster.Brokers, Topic: "jobs", Partition: 0, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	msg, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatalf("kafka read: %v", err)
	}
	got, err := protocol.DecodeJob(msg.Value)
	if err != nil {
		t.Fatal(err)
	}
	if got.Trace != nil {
		t.Fatal("the trace context travelled in the value, not the headers")
	}
	got.Trace, got.TraceDropped = telemetry.TraceFromKafkaHeaders(msg.Headers)
	if got.Trace == nil {
		t.Fatalf("no trace context in the record headers %v", msg.Headers)
	}
	return got
}

// TestTraceAcrossQueue follows one request from the browser's traceparent
// through the api, the queue and the worker to the upstream, as spans
// exported by two providers (api and consumer) to one OTLP receiver.
func TestTraceAcrossQueue(t *testing.T) {
	for _, tt := range []struct {
		system string
		carry  func(*testing.T, protocol.Job) protocol.Job
	}{
		{"redis", viaRedis},
		{"kafka", viaKafka},
	} {
		t.Run(tt.system, func(t *testing.T) {
			clearOTelEnv(t)
			rcv := oteltest.NewHTTP(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
			api, apiShutdown := setup(t, telemetry.ServiceAPI)
			consumer, consumerShutdown := setup(t, telemetry.ServiceConsumer)
			up := newUpstream(t)
			enqueued := make(chan protocol.Job, 1)

			req := httptest.NewRequest(http.MethodPost, "/v1/stream", strings.NewReader(`{}`))
			req.Header.Set("traceparent", incomingParent)
			w := httptest.NewRecorder()
			gateway(t, api, "queued", tt.system, up, enqueued).ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				t.Fatalf("gateway status %d", w.Code)
			}
			worker(t, consumer, tt.carry(t, <-enqueued), tt.system, up)
			upstreamParent := up.traceparent(t)
			// Stop order: the components, then each provider, flushing.
			shutdownNow(t, apiShutdown)
			shutdownNow(t, consumerShutdown)

			spans := rcv.Spans()
			must := func(service, name string) oteltest.Span {
				t.Helper()
				s, ok := oteltest.Find(spans, service, name)
				if !ok {
					t.Fatalf("no span %q from %s; received:\n%v", name, service, spans)
				}
				return s
			}
			server := must(telemetry.ServiceAPI, "POST /v1/stream")
			oteltest.AssertRemoteChildOf(t, server, incomingTraceID, incomingSpanID)
			if server.Kind != tracepb.Span_SPAN_KIND_SERVER || server.Attributes["spillway.request_id"] != "req-1" ||
				server.Attributes["spillway.path"] != "queued" || server.Attributes["spillway.priority"] != "high" {
				t.Errorf("server span %v: kind %v attributes %v", server, server.Kind, server.Attributes)
			}
			for _, name := range []string{telemetry.SpanAdmission, telemetry.SpanPoolAcquire} {
				oteltest.AssertChildOf(t, must(telemetry.ServiceAPI, name), server)
			}
			enq := must(telemetry.ServiceAPI, telemetry.SpanEnqueue)
			oteltest.AssertChildOf(t, enq, server)
			if enq.Kind != tracepb.Span_SPAN_KIND_PRODUCER || enq.Attributes["messaging.system"] != tt.system {
				t.Errorf("enqueue span kind %v attributes %v", enq.Kind, enq.Attributes)
			}

			job := must(telemetry.ServiceConsumer, telemetry.SpanJob)
			oteltest.AssertChildOf(t, job, enq)
			if job.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
				t.Errorf("job span kind %v, want consumer", job.Kind)
			}
			if _, ok := job.Attributes["spillway.queue_wait_ms"].(int64); !ok {
				t.Errorf("job span lacks spillway.queue_wait_ms: %v", job.Attributes)
			}
			wait := must(telemetry.ServiceConsumer, telemetry.SpanQueueWait)
			oteltest.AssertChildOf(t, wait, enq)
			if !wait.End.After(wait.Start) || wait.Start.Before(enq.Start) {
				t.Errorf("queue wait runs %v..%v, enqueue started %v", wait.Start, wait.End, enq.Start)
			}

			chat := must(telemetry.ServiceConsumer, "chat sim-1")
			oteltest.AssertChildOf(t, chat, job)
			checkChatSpan(t, chat)
			checkUpstreamParent(t, spans, chat, upstreamParent)
		})
	}
}

// checkChatSpan checks the GenAI attributes and events of a provider call.
func checkChatSpan(t *testing.T, chat oteltest.Span) {
	t.Helper()
	want := map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "sim-1",
		"gen_ai.usage.output_tokens": int64(1), "gen_ai.usage.input_tokens": int64(3),
	}
	for k, v := range want {
		if chat.Attributes[k] != v {
			t.Errorf("chat span %s = %v, want %v", k, chat.Attributes[k], v)
		}
	}
	if fr, _ := chat.Attributes["gen_ai.response.finish_reasons"].([]any); len(fr) != 1 || fr[0] != "stop" {
		t.Errorf("gen_ai.response.finish_reasons = %v", chat.Attributes["gen_ai.response.finish_reasons"])
	}
	if chat.Kind != tracepb.Span_SPAN_KIND_CLIENT || !chat.HasEvent(telemetry.EventFirstChunk) || !chat.HasEvent(telemetry.EventOutcome) {
		t.Errorf("chat span kind %v events %v", chat.Kind, chat.Events)
	}
}

// checkUpstreamParent checks that the upstream received a traceparent
// naming the HTTP client span under the chat span.
func checkUpstreamParent(t *testing.T, spans []oteltest.Span, chat oteltest.Span, got string) {
	t.Helper()
	var httpSpan *oteltest.Span
	for i, s := range spans {
		if s.ParentSpanID == chat.SpanID && s.Kind == tracepb.Span_SPAN_KIND_CLIENT {
			httpSpan = &spans[i]
		}
	}
	if httpSpan == nil {
		t.Fatalf("no HTTP client span under %v", chat)
	}
	if want := "00-" + chat.TraceID + "-" + httpSpan.SpanID + "-01"; got != want {
		t.Errorf("upstream received traceparent %q, want %q", got, want)
	}
}

func TestTraceDirectPath(t *testing.T) {
	for _, tt := range []struct {
		name, traceparent string
	}{
		{"continues the incoming trace", incomingParent},
		{"starts a new trace without traceparent", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clearOTelEnv(t)
			rcv := oteltest.NewHTTP(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
			api, shutdown := setup(t, telemetry.ServiceAPI)
			up := newUpstream(t)
			req := httptest.NewRequest(http.MethodPost, "/v1/stream", strings.NewReader(`{}`))
			if tt.traceparent != "" {
				req.Header.Set("traceparent", tt.traceparent)
			}
			gateway(t, api, "direct", "", up, nil).ServeHTTP(httptest.NewRecorder(), req)
			upstreamParent := up.traceparent(t)
			shutdownNow(t, shutdown)

			spans := rcv.Spans()
			server, ok := oteltest.Find(spans, telemetry.ServiceAPI, "POST /v1/stream")
			chat, ok2 := oteltest.Find(spans, telemetry.ServiceAPI, "chat sim-1")
			if !ok || !ok2 {
				t.Fatalf("server or chat span missing: %v", spans)
			}
			if tt.traceparent != "" {
				oteltest.AssertRemoteChildOf(t, server, incomingTraceID, incomingSpanID)
			} else if server.ParentSpanID != "" || server.TraceID == incomingTraceID {
				t.Errorf("server span %v has a parent without an incoming traceparent", server)
			}
			if server.Attributes["spillway.path"] != "direct" {
				t.Errorf("server span path %v", server.Attributes["spillway.path"])
			}
			oteltest.AssertChildOf(t, chat, server)
			checkChatSpan(t, chat)
			checkUpstreamParent(t, spans, chat, upstreamParent)
		})
	}
}

// invalidCounter counts spillway_trace_context_invalid_total.
type invalidCounter struct{ n atomic.Int64 }

func (c *invalidCounter) TraceContextInvalid() { c.n.Add(1) }

// TestMalformedTraceNeverFailsJob: a trace field that is junk, out of
// bounds or of the wrong type still lets the job run, as the root of a new
// trace, and is counted once; a good one or none is not counted.
func TestMalformedTraceNeverFailsJob(t *testing.T) {
	clearOTelEnv(t)
	rcv := oteltest.NewHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
	counter := &invalidCounter{}
	consumer, shutdown := setup(t, telemetry.ServiceConsumer, telemetry.WithMetrics(counter))

	const base = `{"v":1,"request_id":"REQ","user_id":"u","payload":{"messages":[{"role":"user","content":"hi"}]},` +
		`"enqueue_time":"2025-01-02T03:04:05Z","deadline":"2099-01-02T03:04:35Z"`
	tests := []struct {
		name      string
		trace     string         // the job's trace field, "" for none
		headers   []kafka.Header // or the record's headers
		wantCount int64
		wantChild bool
	}{
		{name: "valid", trace: `{"traceparent":"` + incomingParent + `"}`, wantChild: true},
		{name: "none", trace: ``},
		{name: "tracestate only", trace: `{"tracestate":"a=b"}`},
		{name: "junk traceparent", trace: `{"traceparent":"not-a-traceparent"}`, wantCount: 1},
		{name: "zero trace id", trace: `{"traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}`, wantCount: 1},
		{name: "version ff", trace: `{"traceparent":"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`, wantCount: 1},
		{name: "upper case hex", trace: `{"traceparent":"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}`, wantCount: 1},
		{name: "oversized", trace: `{"traceparent":"` + strings.Repeat("0", 4096) + `"}`, wantCount: 1},
		{name: "wrong type", trace: `{"traceparent":55}`, wantCount: 1},
		{name: "control characters", trace: `{"traceparent":"00-\u0001"}`, wantCount: 1},
		{name: "kafka valid", headers: []kafka.Header{{Key: "traceparent", Value: []byte(incomingParent)}}, wantChild: true},
		{name: "kafka junk", headers: []kafka.Header{{Key: "traceparent", Value: []byte("00-xyz")}}, wantCount: 1},
		{name: "kafka oversized", headers: []kafka.Header{{Key: "traceparent", Value: []byte(strings.Repeat("f", 1<<16))}}, wantCount: 1},
		{name: "kafka binary", headers: []kafka.Header{{Key: "traceparent", Value: []byte{0, 0xff, '\n'}}}, wantCount: 1},
	}
	for i, tt := range tests {
		before := counter.n.Load()
		reqID := "req-" + strings.ReplaceAll(tt.name, " ", "-")
		wire := strings.Replace(base, "REQ", reqID, 1)
		if tt.trace != "" {
			wire += `,"trace":` + tt.trace
		}
		j, err := protocol.DecodeJob([]byte(wire + `}`))
		if err != nil {
			t.Fatalf("%s: the job failed for its trace field: %v", tt.name, err)
		}
		ctx := consumer.ExtractJob(context.Background(), j)
		if tt.headers != nil {
			ctx = consumer.ExtractKafka(context.Background(), tt.headers)
		}
		if got := trace.SpanContextFromContext(ctx).IsValid(); got != tt.wantChild {
			t.Errorf("%s: extracted a parent: %v, want %v", tt.name, got, tt.wantChild)
		}
		_, span := consumer.StartJob(ctx, telemetry.JobInfo{RequestID: reqID, EnqueueTime: j.EnqueueTime})
		span.End()
		if got := counter.n.Load() - before; got != tt.wantCount {
			t.Errorf("%s (case %d): counted %d invalid trace contexts, want %d", tt.name, i, got, tt.wantCount)
		}
	}
	shutdownNow(t, shutdown)

	for _, tt := range tests {
		reqID := "req-" + strings.ReplaceAll(tt.name, " ", "-")
		var job *oteltest.Span
		for _, s := range rcv.Spans() {
			if s.Name == telemetry.SpanJob && s.Attributes["spillway.request_id"] == reqID {
				job = &s
			}
		}
		switch {
		case job == nil:
			t.Errorf("%s: no job span exported", tt.name)
		case tt.wantChild:
			oteltest.AssertRemoteChildOf(t, *job, incomingTraceID, incomingSpanID)
		case job.ParentSpanID != "":
			t.Errorf("%s: job span %v has a parent", tt.name, job)
		}
	}
}
