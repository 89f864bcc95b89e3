// Package oteltest runs OTLP trace receivers inside a test, over HTTP
// (protobuf) and gRPC, so tests can point the real exporter of an api or a
// consumer at them (OTEL_EXPORTER_OTLP_ENDPOINT) and assert on the spans
// that arrive: names, attributes, services and parent/child links.
package oteltest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// maxRequestBytes bounds one export request the receiver reads.
const maxRequestBytes = 32 << 20

// Span is one received span, flattened from its OTLP resource and scope.
type Span struct {
	Service      string // the resource's service.name
	Scope        string // the instrumentation scope name
	TraceID      string // 32 hex digits
	SpanID       string // 16 hex digits
	ParentSpanID string // "" for a root span
	Name         string
	Kind         tracepb.Span_SpanKind
	Start, End   time.Time
	Attributes   map[string]any // string, bool, int64, float64 or []any
	Events       []Event
	StatusCode   tracepb.Status_StatusCode
	StatusMsg    string
	Resource     map[string]any
}

// Event is one span event.
type Event struct {
	Name       string
	Time       time.Time
	Attributes map[string]any
}

// HasEvent reports whether s has an event called name.
func (s Span) HasEvent(name string) bool {
	_, ok := s.Event(name)
	return ok
}

// Event returns the first event of s called name.
func (s Span) Event(name string) (Event, bool) {
	for _, e := range s.Events {
		if e.Name == name {
			return e, true
		}
	}
	return Event{}, false
}

// String names s for failure messages.
func (s Span) String() string {
	return fmt.Sprintf("%s %q (trace %s span %s parent %q)", s.Service, s.Name, s.TraceID, s.SpanID, s.ParentSpanID)
}

// Receiver collects the spans exported to it. It is safe for concurrent use.
type Receiver struct {
	// Endpoint is the base URL to set as OTEL_EXPORTER_OTLP_ENDPOINT
	// ("http://127.0.0.1:port"); the exporters add /v1/traces themselves
	// for http/protobuf.
	Endpoint string

	mu      sync.Mutex
	spans   []Span
	changed chan struct{} // closed and replaced whenever spans grow
}

func newReceiver() *Receiver {
	return &Receiver{changed: make(chan struct{})}
}

// NewHTTP starts an OTLP/HTTP receiver (protobuf, optionally gzip) on a free
// loopback port; it stops when the test ends.
func NewHTTP(tb testing.TB) *Receiver {
	tb.Helper()
	r := newReceiver()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	srv := httptest.NewServer(mux)
	tb.Cleanup(srv.Close)
	r.Endpoint = srv.URL
	return r
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	var body io.Reader = http.MaxBytesReader(w, req.Body, maxRequestBytes)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, "bad gzip: "+err.Error(), http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = io.LimitReader(zr, maxRequestBytes)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, "read: "+err.Error(), http.StatusBadRequest)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "content type "+ct+", want application/x-protobuf", http.StatusUnsupportedMediaType)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, "decode: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg)
	resp, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = io.Copy(w, bytes.NewReader(resp))
}

// NewGRPC starts an OTLP/gRPC receiver on a free loopback port, without
// TLS (the exporter takes an http:// endpoint as insecure); it stops when
// the test ends.
func NewGRPC(tb testing.TB) *Receiver {
	tb.Helper()
	r := newReceiver()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("oteltest: listen: %v", err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxRequestBytes))
	coltracepb.RegisterTraceServiceServer(srv, grpcService{r: r})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	tb.Cleanup(func() {
		srv.Stop()
		<-done
	})
	r.Endpoint = "http://" + lis.Addr().String()
	return r
}

type grpcService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s grpcService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrMap(rs.GetResource().GetAttributes())
		service, _ := res["service.name"].(string)
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					Service:    service,
					Scope:      ss.GetScope().GetName(),
					TraceID:    hex.EncodeToString(s.GetTraceId()),
					SpanID:     hex.EncodeToString(s.GetSpanId()),
					Name:       s.GetName(),
					Kind:       s.GetKind(),
					Start:      time.Unix(0, int64(s.GetStartTimeUnixNano())),
					End:        time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attributes: attrMap(s.GetAttributes()),
					StatusCode: s.GetStatus().GetCode(),
					StatusMsg:  s.GetStatus().GetMessage(),
					Resource:   res,
				}
				if len(s.GetParentSpanId()) > 0 {
					sp.ParentSpanID = hex.EncodeToString(s.GetParentSpanId())
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, Event{
						Name:       e.GetName(),
						Time:       time.Unix(0, int64(e.GetTimeUnixNano())),
						Attributes: attrMap(e.GetAttributes()),
					})
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
}

func attrMap(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = anyValue(kv.GetValue())
	}
	return m
}

func anyValue(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		out := make([]any, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, anyValue(e))
		}
		return out
	case *commonpb.AnyValue_BytesValue:
		return x.BytesValue
	}
	return nil
}

// Spans returns a copy of every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait waits until cond holds for the spans received so far, failing the
// test if it does not within the deadline. It returns those spans.
func (r *Receiver) Wait(tb testing.TB, within time.Duration, what string, cond func([]Span) bool) []Span {
	tb.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans := append([]Span(nil), r.spans...)
		changed := r.changed
		r.mu.Unlock()
		if cond(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("oteltest: %s: not within %v; received %d spans:\n%s", what, within, len(spans), list(spans))
			return nil
		}
	}
}

// WaitSpan waits for a span called name (of service, unless service is "")
// and returns the first one.
func (r *Receiver) WaitSpan(tb testing.TB, within time.Duration, service, name string) Span {
	tb.Helper()
	var found Span
	r.Wait(tb, within, fmt.Sprintf("span %q of %q", name, service), func(spans []Span) bool {
		s, ok := Find(spans, service, name)
		found = s
		return ok
	})
	return found
}

// Find returns the first span called name of service ("" for any service).
func Find(spans []Span, service, name string) (Span, bool) {
	for _, s := range spans {
		if s.Name == name && (service == "" || s.Service == service) {
			return s, true
		}
	}
	return Span{}, false
}

// AssertChildOf fails the test unless child is a direct child of parent in
// the same trace.
func AssertChildOf(tb testing.TB, child, parent Span) {
	tb.Helper()
	if child.TraceID != parent.TraceID {
		tb.Errorf("oteltest: %v is not in the trace of %v", child, parent)
		return
	}
	if child.ParentSpanID != parent.SpanID {
		tb.Errorf("oteltest: %v is not a child of %v", child, parent)
	}
}

// AssertRemoteChildOf fails the test unless s continues the span identified
// by traceID and spanID (hex), as a server or consumer span continues a
// traceparent it received.
func AssertRemoteChildOf(tb testing.TB, s Span, traceID, spanID string) {
	tb.Helper()
	if s.TraceID != traceID || s.ParentSpanID != spanID {
		tb.Errorf("oteltest: %v does not continue trace %s span %s", s, traceID, spanID)
	}
}

func list(spans []Span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %v\n", s)
	}
	return b.String()
}
