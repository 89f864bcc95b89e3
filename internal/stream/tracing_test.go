package stream

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// discardResponse is a ResponseWriter that allocates nothing per write.
type discardResponse struct{ h http.Header }

func (d discardResponse) Header() http.Header            { return d.h }
func (discardResponse) Write(b []byte) (int, error)      { return len(b), nil }
func (discardResponse) WriteHeader(int)                  {}
func (discardResponse) Flush()                           {}
func (discardResponse) SetWriteDeadline(time.Time) error { return nil }

// With tracing off (no OTLP endpoint), the tracing the handler added to
// the direct path allocates nothing: per request (admission span, path,
// first chunk with its exemplar-capable observation, outcome) and per
// chunk written, beyond the SSE writer's own.
func TestDirectPathTracingOffAllocatesNothing(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tel, _, err := telemetry.Setup(context.Background(), telemetry.ServiceAPI, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tel.Enabled() {
		t.Fatal("tracing on with an empty endpoint")
	}
	m := metrics.New(prometheus.NewRegistry())
	h := &Handler{cfg: Config{}.withDefaults(), gate: openGate{}, m: m, log: testutil.DiscardLogger(), tel: tel}
	s := &session{h: h, sink: openNative(discardResponse{h: http.Header{}}, time.Second), attached: true, requestID: "r", path: protocol.PathDirect,
		start: time.Now(), ctx: context.Background()}
	batch := protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "token"}}}
	ctx := context.Background()

	perRequest := testing.AllocsPerRun(200, func() {
		_ = h.admit(ctx, "user", protocol.PriorityNormal)
		s.firstChunkWritten()
		s.traceEnd(OutcomeDone)
	})
	if perRequest != 0 {
		t.Errorf("tracing off: %v allocations per request in the tracing steps, want 0", perRequest)
	}
	s.firstChunk = false
	perChunk := testing.AllocsPerRun(1000, func() {
		if _, _, err := s.write(batch); err != nil {
			t.Fatal(err)
		}
	})
	// The chunk event's encoding and the SSE writer allocate nothing per
	// chunk either (alloc_test.go covers the whole direct path).
	if perChunk != 0 {
		t.Errorf("tracing off: %v allocations per chunk written, want 0", perChunk)
	}
}
