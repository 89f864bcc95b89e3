package oteltest_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/spillway-dev/spillway/internal/testkit/oteltest"
)

func request() *coltracepb.ExportTraceServiceRequest {
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{
			Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "svc"}},
		}}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{
			{TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{2}, 8), Name: "parent"},
			{TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{3}, 8), ParentSpanId: bytes.Repeat([]byte{2}, 8), Name: "child"},
		}}},
	}}}
}

func TestHTTPReceiverDecodesGzipAndRefusesJunk(t *testing.T) {
	t.Parallel()
	r := oteltest.NewHTTP(t)
	b, err := proto.Marshal(request())
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(b)
	_ = zw.Close()

	post := func(body []byte, contentType, encoding string) int {
		req, _ := http.NewRequest(http.MethodPost, r.Endpoint+"/v1/traces", bytes.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		if encoding != "" {
			req.Header.Set("Content-Encoding", encoding)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(b, "application/json", ""); code != http.StatusUnsupportedMediaType {
		t.Errorf("JSON body: status %d", code)
	}
	if code := post([]byte("\xff\xff"), "application/x-protobuf", ""); code != http.StatusBadRequest {
		t.Errorf("junk body: status %d", code)
	}
	if code := post(gz.Bytes(), "application/x-protobuf", "gzip"); code != http.StatusOK {
		t.Fatalf("gzip body: status %d", code)
	}
	spans := r.Wait(t, 5*time.Second, "two spans", func(s []oteltest.Span) bool { return len(s) == 2 })
	parent, _ := oteltest.Find(spans, "svc", "parent")
	child, ok := oteltest.Find(spans, "svc", "child")
	if !ok || parent.ParentSpanID != "" {
		t.Fatalf("spans %v", spans)
	}
	oteltest.AssertChildOf(t, child, parent)
	ft := &fakeTB{TB: t}
	oteltest.AssertChildOf(ft, parent, child)
	if !ft.failed {
		t.Error("AssertChildOf accepted a parent as its child's child")
	}
}

// fakeTB records a failure instead of failing the test.
type fakeTB struct {
	testing.TB
	failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Errorf(string, ...any) { f.failed = true }
