package protocol

import (
	"errors"
	"strings"
	"testing"
)

// A trace context as the W3C propagator writes it (the example of the
// traceparent specification, with a tracestate and baggage).
const (
	sampleTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sampleTraceState  = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
	sampleBaggage     = "userId=alice,isProduction=false"
)

func sampleTracedJob() Job {
	j := sampleJob()
	j.Trace = &TraceContext{TraceParent: sampleTraceParent, TraceState: sampleTraceState, Baggage: sampleBaggage}
	return j
}

var sampleTracedJobWire = strings.TrimSuffix(sampleJobWire, `}`) +
	`,"trace":{"traceparent":"` + sampleTraceParent + `","tracestate":"` + sampleTraceState + `","baggage":"` + sampleBaggage + `"}}`

func TestEncodeJobTraceGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   *TraceContext
		want string
	}{
		{"full", sampleTracedJob().Trace, sampleTracedJobWire},
		{"traceparent only", &TraceContext{TraceParent: sampleTraceParent},
			strings.TrimSuffix(sampleJobWire, `}`) + `,"trace":{"traceparent":"` + sampleTraceParent + `"}}`},
		// An empty or invalid context is left out, never written for
		// DecodeJob to drop.
		{"empty", &TraceContext{}, sampleJobWire},
		{"invalid", &TraceContext{TraceParent: "00-\n"}, sampleJobWire},
		{"too long", &TraceContext{Baggage: strings.Repeat("k=v,", MaxBaggageBytes)}, sampleJobWire},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := sampleJob()
			j.Trace = tt.in
			got, err := EncodeJob(j)
			if err != nil {
				t.Fatalf("EncodeJob: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("EncodeJob =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestDecodeJobTraceGolden(t *testing.T) {
	t.Parallel()
	got, err := DecodeJob([]byte(sampleTracedJobWire))
	if err != nil {
		t.Fatalf("DecodeJob: %v", err)
	}
	if want := sampleTracedJob(); !jobsEqual(got, want) {
		t.Errorf("DecodeJob =\n%+v\nwant\n%+v", got, want)
	}
	if got.TraceDropped {
		t.Error("TraceDropped set for a valid trace context")
	}
}

// TestDecodeJobWithoutTrace is the backward-compatibility promise: a job
// written before the trace field existed decodes with no trace and nothing
// to count.
func TestDecodeJobWithoutTrace(t *testing.T) {
	t.Parallel()
	got, err := DecodeJob([]byte(sampleJobWire))
	if err != nil {
		t.Fatalf("DecodeJob: %v", err)
	}
	if got.Trace != nil || got.TraceDropped {
		t.Errorf("job without trace decoded with Trace %+v, TraceDropped %v", got.Trace, got.TraceDropped)
	}
}

// TestDecodeJobTraceAccepted lists trace fields the decoder keeps (or, when
// they hold nothing, reduces to no trace) without counting them as bad.
func TestDecodeJobTraceAccepted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		trace string // the JSON value of "trace"
		want  *TraceContext
	}{
		{"null", `null`, nil},
		{"empty object", `{}`, nil},
		{"empty strings", `{"traceparent":"","tracestate":"","baggage":""}`, nil},
		{"null values", `{"traceparent":null}`, nil},
		{"unknown keys ignored", `{"traceparent":"` + sampleTraceParent + `","x-future":[1,{"a":2}]}`,
			&TraceContext{TraceParent: sampleTraceParent}},
		// Parsing is the tracer's job: printable junk within bounds is
		// carried, and the consumer counts it when it fails to parse.
		{"printable junk", `{"traceparent":"not a traceparent"}`, &TraceContext{TraceParent: "not a traceparent"}},
		{"baggage only", `{"baggage":"` + sampleBaggage + `"}`, &TraceContext{Baggage: sampleBaggage}},
		{"traceparent at bound", `{"traceparent":"` + strings.Repeat("f", MaxTraceParentBytes) + `"}`,
			&TraceContext{TraceParent: strings.Repeat("f", MaxTraceParentBytes)}},
		{"tracestate at bound", `{"tracestate":"` + strings.Repeat("a", MaxTraceStateBytes) + `"}`,
			&TraceContext{TraceState: strings.Repeat("a", MaxTraceStateBytes)}},
		{"baggage at bound", `{"baggage":"` + strings.Repeat("b", MaxBaggageBytes) + `"}`,
			&TraceContext{Baggage: strings.Repeat("b", MaxBaggageBytes)}},
		{"escaped ascii", `{"traceparent":"00\u002d4b"}`, &TraceContext{TraceParent: "00-4b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := strings.TrimSuffix(sampleJobWire, `}`) + `,"trace":` + tt.trace + `}`
			got, err := DecodeJob([]byte(in))
			if err != nil {
				t.Fatalf("DecodeJob: %v", err)
			}
			if got.TraceDropped {
				t.Errorf("TraceDropped set for %s", tt.trace)
			}
			switch {
			case tt.want == nil && got.Trace != nil:
				t.Errorf("Trace = %+v, want nil", *got.Trace)
			case tt.want != nil && (got.Trace == nil || *got.Trace != *tt.want):
				t.Errorf("Trace = %+v, want %+v", got.Trace, *tt.want)
			}
		})
	}
}

// TestDecodeJobTraceDropped lists trace fields that are malformed or out of
// bounds: the job still decodes, without its trace, and says it dropped one.
func TestDecodeJobTraceDropped(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		trace string
	}{
		{"number", `5`},
		{"string", `"` + sampleTraceParent + `"`},
		{"array", `["` + sampleTraceParent + `"]`},
		{"bool", `true`},
		{"traceparent number", `{"traceparent":42}`},
		{"traceparent object", `{"traceparent":{"v":"00"}}`},
		{"tracestate array", `{"traceparent":"` + sampleTraceParent + `","tracestate":["a"]}`},
		{"traceparent too long", `{"traceparent":"` + strings.Repeat("f", MaxTraceParentBytes+1) + `"}`},
		{"tracestate too long", `{"traceparent":"` + sampleTraceParent + `","tracestate":"` + strings.Repeat("a", MaxTraceStateBytes+1) + `"}`},
		{"baggage too long", `{"baggage":"` + strings.Repeat("b", MaxBaggageBytes+1) + `"}`},
		{"traceparent newline", `{"traceparent":"00-4b\n"}`},
		{"traceparent CR", `{"traceparent":"00-4b\r"}`},
		{"traceparent NUL", `{"traceparent":"00-\u0000"}`},
		{"traceparent DEL", `{"traceparent":"00-\u007f"}`},
		{"traceparent tab", `{"traceparent":"00-\t"}`},
		{"tracestate unicode", `{"tracestate":"rojo=ü"}`},
		{"baggage invalid utf8", "{\"baggage\":\"k=\xff\"}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := strings.TrimSuffix(sampleJobWire, `}`) + `,"trace":` + tt.trace + `}`
			got, err := DecodeJob([]byte(in))
			if err != nil {
				t.Fatalf("DecodeJob failed the job for its trace field: %v", err)
			}
			if got.Trace != nil || !got.TraceDropped {
				t.Errorf("Trace = %+v, TraceDropped = %v; want nil, true", got.Trace, got.TraceDropped)
			}
			if want := sampleJob(); !jobsEqual(withoutTraceDropped(got), want) {
				t.Errorf("rest of the job changed:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestTraceContextValidate(t *testing.T) {
	t.Parallel()
	var malformed TraceContext
	if err := malformed.UnmarshalJSON([]byte(`[1]`)); err != nil {
		t.Fatalf("UnmarshalJSON returned %v; it must never fail a job", err)
	}
	if err := malformed.Validate(); !errors.Is(err, ErrTraceContext) {
		t.Errorf("Validate of a malformed context = %v, want ErrTraceContext", err)
	}
	if malformed.IsZero() {
		t.Error("a malformed context reports IsZero; it would be dropped without being counted")
	}
	ok := TraceContext{TraceParent: sampleTraceParent, TraceState: sampleTraceState, Baggage: sampleBaggage}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v", ok, err)
	}
	long := TraceContext{TraceState: strings.Repeat("a", 100_000)}
	if err := long.Validate(); err == nil || len(err.Error()) > 200 {
		t.Errorf("Validate of a 100 kB tracestate = %v; want a short error", err)
	}
}

func withoutTraceDropped(j Job) Job {
	j.TraceDropped = false
	return j
}
