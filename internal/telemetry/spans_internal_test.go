package telemetry

import (
	"context"
	"strings"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// newRecordingProvider is a Provider on the SDK's in-memory recorder.
func newRecordingProvider(t *testing.T) (*Provider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Provider{on: true, tp: tp, tracer: tp.Tracer(instrumentationName), prop: w3cPropagator()}, rec
}

func TestOutcomeAndEvents(t *testing.T) {
	t.Parallel()
	p, rec := newRecordingProvider(t)
	_, span := p.StartProviderCall(context.Background(), "openai", "gpt-x")
	Retrying(span, "429", 2500*time.Millisecond)
	Reset(span, 2)
	FirstChunk(span)
	Outcome(span, OutcomeError, "https://spillway.dev/errors/provider-error")
	span.End()
	_, ok := p.StartAdmission(context.Background())
	Outcome(ok, "done", "")
	ok.End()

	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2", len(ended))
	}
	call := ended[0]
	if call.Name() != "chat gpt-x" || call.SpanKind() != trace.SpanKindClient {
		t.Errorf("call span %q kind %v", call.Name(), call.SpanKind())
	}
	if call.Status().Code != codes.Error || call.Status().Description != "https://spillway.dev/errors/provider-error" {
		t.Errorf("status %+v, want Error with the problem type", call.Status())
	}
	var names []string
	for _, e := range call.Events() {
		names = append(names, e.Name)
		if e.Name == EventRetrying {
			got := map[string]any{}
			for _, a := range e.Attributes {
				got[string(a.Key)] = a.Value.AsInterface()
			}
			if got["spillway.retry.reason"] != "429" || got["spillway.retry.delay_ms"] != int64(2500) {
				t.Errorf("retrying attributes %v", got)
			}
		}
	}
	if strings.Join(names, ",") != "retrying,reset,first_chunk,outcome" {
		t.Errorf("events %v", names)
	}
	if ended[1].Status().Code == codes.Error {
		t.Error("a done outcome set an error status")
	}
}

func TestStartJobQueueWait(t *testing.T) {
	t.Parallel()
	p, rec := newRecordingProvider(t)
	enq := time.Now().Add(-1500 * time.Millisecond)
	started := enq.Add(1500 * time.Millisecond)
	_, span := p.StartJob(context.Background(), JobInfo{RequestID: "r", Priority: "low", EnqueueTime: enq, Started: started})
	span.End()
	// A worker clock behind the api's gives no queue-wait span, not a
	// negative one.
	_, skew := p.StartJob(context.Background(), JobInfo{RequestID: "s", EnqueueTime: started.Add(time.Hour), Started: started})
	skew.End()

	ended := rec.Ended()
	if len(ended) != 3 || ended[0].Name() != SpanQueueWait || ended[1].Name() != SpanJob || ended[2].Name() != SpanJob {
		t.Fatalf("spans %v", ended)
	}
	wait := ended[0]
	if !wait.StartTime().Equal(enq) || !wait.EndTime().Equal(started) {
		t.Errorf("queue wait %v..%v, want %v..%v", wait.StartTime(), wait.EndTime(), enq, started)
	}
	for i, want := range []int64{1500, 0} {
		var got any
		for _, a := range ended[i+1].Attributes() {
			if a.Key == AttrQueueWaitMS {
				got = a.Value.AsInterface()
			}
		}
		if got != want {
			t.Errorf("job %d spillway.queue_wait_ms = %v, want %d", i, got, want)
		}
	}
}

func TestInjectJobKeepsWithinBounds(t *testing.T) {
	t.Parallel()
	p, _ := newRecordingProvider(t)
	// 32 members of 40 characters: a legal tracestate of ~1.3 kB, more
	// than a job carries.
	var members []string
	for i := 0; i < 32; i++ {
		members = append(members, "vendor"+string(rune('a'+i%26))+string(rune('a'+i/26))+"="+strings.Repeat("v", 30))
	}
	ts, err := trace.ParseTraceState(strings.Join(members, ","))
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts,
	}))
	tc := p.InjectJob(ctx)
	if tc == nil || tc.TraceParent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("InjectJob = %+v", tc)
	}
	if tc.TraceState != "" || tc.Validate() != nil {
		t.Errorf("InjectJob kept a tracestate of %d bytes (limit %d)", len(tc.TraceState), protocol.MaxTraceStateBytes)
	}
}

func TestKafkaCarrier(t *testing.T) {
	t.Parallel()
	headers := []kafka.Header{{Key: "other", Value: []byte("x")}, {Key: "traceparent", Value: []byte("old")}}
	c := KafkaCarrier{&headers}
	c.Set("traceparent", "new")
	c.Set("tracestate", "a=b")
	if len(headers) != 3 || c.Get("traceparent") != "new" || c.Get("tracestate") != "a=b" || c.Get("other") != "x" {
		t.Errorf("headers after Set: %v", headers)
	}
	if got := strings.Join(c.Keys(), ","); got != "other,traceparent,tracestate" {
		t.Errorf("Keys = %s", got)
	}
	if c.Get("baggage") != "" {
		t.Error("Get of a missing header is not empty")
	}

	tc := &protocol.TraceContext{TraceParent: "tp", Baggage: "k=v"}
	back, dropped := TraceFromKafkaHeaders(KafkaHeaders(tc))
	if dropped || back == nil || *back != *tc {
		t.Errorf("KafkaHeaders round trip = %+v, %v; want %+v", back, dropped, *tc)
	}
	if tc, dropped := TraceFromKafkaHeaders([]kafka.Header{{Key: "other"}}); tc != nil || dropped {
		t.Errorf("no trace headers gave %+v, %v", tc, dropped)
	}
}
