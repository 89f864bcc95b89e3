package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Bounds of the trace context a job may carry. A traceparent of W3C version
// 00 is 55 characters; later versions may append fields, hence the room.
// W3C asks vendors to propagate at least 512 characters of tracestate, and
// limits baggage to 8192 bytes.
const (
	MaxTraceParentBytes = 128
	MaxTraceStateBytes  = 512
	MaxBaggageBytes     = 8192
)

// ErrTraceContext is wrapped by TraceContext.Validate.
var ErrTraceContext = errors.New("protocol: trace context")

// TraceContext is the W3C trace context carried by a queued job: the values
// of the traceparent, tracestate and baggage headers as the api's propagator
// wrote them. This package only bounds them; parsing is the tracer's job,
// and a value the tracer cannot parse starts a new trace rather than failing
// the job (docs/TRACING.md).
type TraceContext struct {
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
	Baggage     string `json:"baggage,omitempty"`

	// malformed records that the wire value was not an object of strings.
	malformed bool
}

// UnmarshalJSON reads a trace object leniently: a wrong type anywhere in it
// marks it malformed instead of failing the whole job, because a job must
// never be dead-lettered for its tracing. Unknown keys are ignored so a
// later writer may add some.
func (t *TraceContext) UnmarshalJSON(b []byte) error {
	*t = TraceContext{}
	var raw struct {
		TraceParent json.RawMessage `json:"traceparent"`
		TraceState  json.RawMessage `json:"tracestate"`
		Baggage     json.RawMessage `json:"baggage"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.malformed = true
		return nil
	}
	for _, f := range []struct {
		raw json.RawMessage
		dst *string
	}{{raw.TraceParent, &t.TraceParent}, {raw.TraceState, &t.TraceState}, {raw.Baggage, &t.Baggage}} {
		if f.raw == nil {
			continue
		}
		if err := json.Unmarshal(f.raw, f.dst); err != nil {
			t.malformed = true
			*f.dst = ""
		}
	}
	return nil
}

// IsZero reports whether t carries nothing.
func (t TraceContext) IsZero() bool {
	return t.TraceParent == "" && t.TraceState == "" && t.Baggage == "" && !t.malformed
}

// Validate checks the bounds a job's trace context must keep: each value at
// most its Max*Bytes long and printable ASCII (the character set of all
// three headers), so junk in a job stays small and cannot inject anything
// into a log line or a header. It does not parse the values.
func (t TraceContext) Validate() error {
	if t.malformed {
		return fmt.Errorf("%w: not an object of strings", ErrTraceContext)
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"traceparent", t.TraceParent, MaxTraceParentBytes},
		{"tracestate", t.TraceState, MaxTraceStateBytes},
		{"baggage", t.Baggage, MaxBaggageBytes},
	} {
		if len(f.v) > f.max {
			return fmt.Errorf("%w: %s of %d bytes exceeds %d", ErrTraceContext, f.name, len(f.v), f.max)
		}
		if !printableASCII(f.v) {
			return fmt.Errorf("%w: %s holds a byte outside printable ASCII", ErrTraceContext, f.name)
		}
	}
	return nil
}

// printableASCII reports whether s is made of bytes 0x20 to 0x7E only.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// normalizeTrace returns the trace context a job should carry for t: nil
// when t is nil or empty, nil and dropped=true when t fails Validate.
func normalizeTrace(t *TraceContext) (tc *TraceContext, dropped bool) {
	if t == nil || t.IsZero() {
		return nil, false
	}
	if t.Validate() != nil {
		return nil, true
	}
	return t, false
}
