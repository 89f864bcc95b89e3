package app

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
	"github.com/spillway-dev/spillway/internal/testkit/oteltest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// The trace a test request continues: its traceparent's ids.
const (
	testTraceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
	testParentID = "00f067aa0ba902b7"
	spanWait     = 20 * time.Second
)

// tracedUpstream is simllm behind a handler that records the traceparent
// of every request, and answers the first one 503 when failFirst is set,
// so a worker retries.
type tracedUpstream struct {
	mu          sync.Mutex
	traceparent []string
	failFirst   bool
}

func startTracedUpstream(tb testing.TB, sc llm.SimConfig, failFirst bool) (*tracedUpstream, string) {
	tb.Helper()
	sim, err := llm.NewSim(sc)
	if err != nil {
		tb.Fatal(err)
	}
	srv := simserver.New(sim, testLog(tb))
	u := &tracedUpstream{failFirst: failFirst}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.traceparent = append(u.traceparent, r.Header.Get("traceparent"))
		fail := u.failFirst && len(u.traceparent) == 1
		u.mu.Unlock()
		if fail {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		srv.ServeHTTP(w, r)
	}))
	tb.Cleanup(ts.Close)
	return u, ts.URL + "/v1"
}

func (u *tracedUpstream) received() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.traceparent...)
}

// tracingEnv turns tracing on for this process's api (t.Setenv: these
// tests do not run in parallel) and returns the same settings for a
// consumer process.
func tracingEnv(t *testing.T, rcv *oteltest.Receiver) map[string]string {
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.Endpoint, "OTEL_BSP_SCHEDULE_DELAY": "20"}
	for k, v := range env {
		t.Setenv(k, v)
	}
	return env
}

// streamTraced posts one request, with traceparent when not empty, and
// reads the whole answer, which must end with done.
func streamTraced(t *testing.T, url, text, traceparent string) {
	t.Helper()
	hdr := map[string]string{}
	if traceparent != "" {
		hdr["traceparent"] = traceparent
	}
	resp := postStream(t, t.Context(), url, prompt(text), hdr)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "event: done") {
		t.Fatalf("status %d, body:\n%s", resp.StatusCode, body)
	}
}

// serverSpan waits for the api's server span continuing the test trace
// and returns it.
func serverSpan(t *testing.T, rcv *oteltest.Receiver) oteltest.Span {
	t.Helper()
	var srv oteltest.Span
	rcv.Wait(t, spanWait, "api server span", func(spans []oteltest.Span) bool {
		for _, s := range spans {
			if s.Service == telemetry.ServiceAPI && s.Name == "POST /v1/stream" && s.TraceID == testTraceID {
				srv = s
				return true
			}
		}
		return false
	})
	oteltest.AssertRemoteChildOf(t, srv, testTraceID, testParentID)
	return srv
}

// testQueuedTrace checks one queued request's trace across the api, the
// queue, a consumer process and the upstream.
func testQueuedTrace(t *testing.T, kafka bool) {
	rcv := oteltest.NewHTTP(t)
	env := tracingEnv(t, rcv)
	sc := fastSim()
	up, upURL := startTracedUpstream(t, sc, true)
	env["LLM_BASE_URL"] = upURL
	var c *cluster
	if kafka {
		c, _ = kafkaCluster(t, sc, env)
	} else {
		c = newCluster(t, sc, env)
	}
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	consumer := c.consumer(nil)

	streamTraced(t, url, "trace me through the queue", "00-"+testTraceID+"-"+testParentID+"-01")

	srv := serverSpan(t, rcv)
	if srv.Attributes[string(telemetry.AttrPath)] != protocol.PathQueued || srv.Attributes[string(telemetry.AttrRequestID)] == nil {
		t.Errorf("server span attributes %v", srv.Attributes)
	}
	if !srv.HasEvent(telemetry.EventFirstChunk) || !srv.HasEvent(telemetry.EventOutcome) {
		t.Errorf("server span events %v", srv.Events)
	}
	enq := rcv.WaitSpan(t, spanWait, telemetry.ServiceAPI, telemetry.SpanEnqueue)
	oteltest.AssertChildOf(t, enq, srv)
	wantSystem := "redis"
	if kafka {
		wantSystem = "kafka"
	}
	if enq.Attributes[string(telemetry.AttrMessagingSystem)] != wantSystem {
		t.Errorf("enqueue span attributes %v", enq.Attributes)
	}
	job := rcv.WaitSpan(t, spanWait, telemetry.ServiceConsumer, telemetry.SpanJob)
	oteltest.AssertChildOf(t, job, enq)
	if !job.HasEvent(telemetry.EventRetrying) || job.Attributes[string(telemetry.AttrOutcome)] != "done" {
		t.Errorf("job span: events %v attributes %v", job.Events, job.Attributes)
	}
	call := waitSpanPrefix(t, rcv, telemetry.ServiceConsumer, "chat", job.TraceID, "done")
	oteltest.AssertChildOf(t, call, job)
	if call.Attributes[string(telemetry.AttrGenAISystem)] != "openai" || call.Attributes[string(telemetry.AttrGenAIOutputTokens)] == nil {
		t.Errorf("provider call attributes %v", call.Attributes)
	}

	// The upstream got the trace twice (the 503 and the retry).
	got := up.received()
	if len(got) != 2 {
		t.Fatalf("upstream received %d requests, want 2", len(got))
	}
	for _, tp := range got {
		if !strings.HasPrefix(tp, "00-"+testTraceID+"-") {
			t.Errorf("upstream traceparent %q, want trace %s", tp, testTraceID)
		}
	}
	// The consumer's log line about the retry leads to the trace.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return strings.Contains(consumer.Log(), `"trace_id":"`+testTraceID+`"`)
	}, "consumer log line with the trace id")
}

// waitSpanPrefix waits for a span of service in trace whose name starts
// with prefix and whose outcome is outcome.
func waitSpanPrefix(t *testing.T, rcv *oteltest.Receiver, service, prefix, traceID, outcome string) oteltest.Span {
	t.Helper()
	var found oteltest.Span
	rcv.Wait(t, spanWait, "span "+prefix+"* of "+service, func(spans []oteltest.Span) bool {
		for _, s := range spans {
			if s.Service == service && strings.HasPrefix(s.Name, prefix) && s.TraceID == traceID &&
				s.Attributes[string(telemetry.AttrOutcome)] == outcome {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

// One request with a traceparent, queued on Redis Streams: one trace from
// the caller's span through the api, the consumer and the upstream.
func TestTraceQueuedRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	testQueuedTrace(t, false)
}

// The same over Kafka, where the context travels in record headers.
func TestTraceQueuedKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	testQueuedTrace(t, true)
}

// The direct path: the server span continues the caller's trace, the
// provider call is its child, and the upstream receives the trace.
func TestTraceDirect(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	rcv := oteltest.NewHTTP(t)
	env := tracingEnv(t, rcv)
	sc := fastSim()
	up, upURL := startTracedUpstream(t, sc, false)
	env["LLM_BASE_URL"] = upURL
	c := newCluster(t, sc, env)
	_, url := c.api(nil)

	streamTraced(t, url, "trace me directly", "00-"+testTraceID+"-"+testParentID+"-01")
	srv := serverSpan(t, rcv)
	if srv.Attributes[string(telemetry.AttrPath)] != protocol.PathDirect {
		t.Errorf("server span attributes %v", srv.Attributes)
	}
	adm := rcv.WaitSpan(t, spanWait, telemetry.ServiceAPI, telemetry.SpanAdmission)
	oteltest.AssertChildOf(t, adm, srv)
	acq := rcv.WaitSpan(t, spanWait, telemetry.ServiceAPI, telemetry.SpanPoolAcquire)
	oteltest.AssertChildOf(t, acq, srv)
	call := waitSpanPrefix(t, rcv, telemetry.ServiceAPI, "chat", testTraceID, "done")
	oteltest.AssertChildOf(t, call, srv)
	if !call.HasEvent(telemetry.EventFirstChunk) {
		t.Errorf("provider call events %v", call.Events)
	}
	got := up.received()
	if len(got) != 1 || !strings.HasPrefix(got[0], "00-"+testTraceID+"-") {
		t.Fatalf("upstream traceparents %q, want one of trace %s", got, testTraceID)
	}

	// Without a traceparent the request starts a trace of its own.
	streamTraced(t, url, "a new trace", "")
	rcv.Wait(t, spanWait, "a root server span", func(spans []oteltest.Span) bool {
		for _, s := range spans {
			if s.Service == telemetry.ServiceAPI && s.Name == "POST /v1/stream" && s.TraceID != testTraceID && s.ParentSpanID == "" {
				return true
			}
		}
		return false
	})
}

// A job whose trace field does not parse still runs, as the root of a new
// trace, and is counted.
func TestTraceMalformedJobFieldStillRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	rcv := oteltest.NewHTTP(t)
	env := tracingEnv(t, rcv)
	c := newCluster(t, fastSim(), env)
	consumer := c.consumer(nil)

	q, err := redisstream.New(redisstream.Config{Prefix: c.prefix, Consumer: "producer"}, c.rdb)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	const requestID = "bad-trace-job"
	body, err := protocol.EncodeJob(protocol.Job{
		RequestID: requestID, UserID: "u", EnqueueTime: now, Deadline: now.Add(time.Minute),
		Payload: protocol.ChatRequest{Messages: userMsgs("bad trace")},
		Trace:   &protocol.TraceContext{TraceParent: "00-not-a-trace-01"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Enqueue(context.Background(), requestID, body); err != nil {
		t.Fatal(err)
	}
	job := rcv.WaitSpan(t, spanWait, telemetry.ServiceConsumer, telemetry.SpanJob)
	if job.ParentSpanID != "" || job.Attributes[string(telemetry.AttrRequestID)] != requestID {
		t.Errorf("job span %v: want a root span of %s", job, requestID)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return consumer.Metric("spillway_trace_context_invalid_total") == 1
	}, "invalid trace context counted once")
	testutil.Eventually(t, 10*time.Second, func() bool {
		return consumer.Metric(`spillway_worker_jobs_total{outcome="dead_letter"}`) == 0 &&
			consumer.Metric(`spillway_worker_jobs_total{outcome="done"}`)+consumer.Metric(`spillway_worker_jobs_total{outcome="cancelled"}`) == 1
	}, "job run, not dead-lettered")
}

// A queued stream that waits for a worker parks (its handler returns,
// docs/TRACING.md): its server span ends then, before any worker has the
// job, and the rest of the stream, its first chunk and outcome included,
// is in spillway.stream.parked, the server span's child.
func TestTraceParkedStream(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	rcv := oteltest.NewHTTP(t)
	env := tracingEnv(t, rcv)
	c := newCluster(t, fastSim(), env)
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	resp := postStream(t, t.Context(), url, prompt("wait for a worker"),
		map[string]string{"traceparent": "00-" + testTraceID + "-" + testParentID + "-01"})
	defer resp.Body.Close()
	// No consumer runs yet: the server span is exported only once it
	// ended, that is once the waiting stream parked.
	srv := serverSpan(t, rcv)
	if srv.Attributes[string(telemetry.AttrPath)] != protocol.PathQueued || srv.HasEvent(telemetry.EventOutcome) {
		t.Errorf("server span of a parked stream: attributes %v, events %v", srv.Attributes, srv.Events)
	}
	c.consumer(nil)
	body, err := io.ReadAll(resp.Body)
	if err != nil || !strings.Contains(string(body), "event: done") {
		t.Fatalf("stream after parking: %v\n%s", err, body)
	}
	parked := rcv.WaitSpan(t, spanWait, telemetry.ServiceAPI, telemetry.SpanParked)
	oteltest.AssertChildOf(t, parked, srv)
	if !parked.HasEvent(telemetry.EventFirstChunk) || parked.Attributes[string(telemetry.AttrOutcome)] != "done" {
		t.Errorf("parked span: events %v, attributes %v", parked.Events, parked.Attributes)
	}
}
