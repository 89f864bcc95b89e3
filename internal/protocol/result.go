package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// MaxResultBytes bounds one result-channel message; larger ones are refused
// by DecodeResult.
const MaxResultBytes = 1 << 20

// ResultKind says what a result-channel message is.
type ResultKind uint8

// The result-channel message kinds.
const (
	KindBatch ResultKind = iota + 1
	KindDone
	KindError
	KindHeartbeat
	KindReset
	// KindRetrying says the worker waits out a backoff before trying the
	// provider again (SIGNAL:RETRYING:{json}, the SSE `retrying` event).
	KindRetrying
)

// String names the kind for logs and metrics.
func (k ResultKind) String() string {
	switch k {
	case KindBatch:
		return "batch"
	case KindDone:
		return "done"
	case KindError:
		return "error"
	case KindHeartbeat:
		return "heartbeat"
	case KindReset:
		return "reset"
	case KindRetrying:
		return "retrying"
	}
	return "unknown"
}

// Result is one message on a request's result channel, as a worker publishes
// it: `BATCH:[…]`, `SIGNAL:DONE[:{json}]`, `SIGNAL:ERROR:{problem}`,
// `SIGNAL:HEARTBEAT`, `SIGNAL:RESET:{json}` or `SIGNAL:RETRYING:{json}`.
type Result struct {
	Kind     ResultKind
	Chunks   []Chunk   // KindBatch
	Done     *Done     // KindDone, may be nil
	Problem  *Problem  // KindError
	Reset    *Reset    // KindReset
	Retrying *Retrying // KindRetrying
}

// ErrMalformed is wrapped by every decoding error of this package.
var ErrMalformed = errors.New("protocol: malformed message")

var (
	prefixBatch     = []byte("BATCH:")
	prefixDone      = []byte("SIGNAL:DONE")
	prefixError     = []byte("SIGNAL:ERROR:")
	prefixHeartbeat = []byte("SIGNAL:HEARTBEAT")
	prefixReset     = []byte("SIGNAL:RESET:")
	prefixRetrying  = []byte("SIGNAL:RETRYING:")
)

// EncodeResult returns the wire form of r. It refuses a result that
// DecodeResult would refuse, so a worker learns at publish time rather than
// the api dropping the message.
func EncodeResult(r Result) ([]byte, error) {
	var (
		out []byte
		err error
	)
	switch r.Kind {
	case KindBatch:
		if err = checkBatch(r.Chunks); err == nil {
			out, err = appendJSON(prefixBatch, r.Chunks)
		}
	case KindDone:
		if r.Done == nil {
			return append([]byte(nil), prefixDone...), nil
		}
		out, err = appendJSON(append(append([]byte(nil), prefixDone...), ':'), r.Done)
	case KindError:
		if err = checkProblem(r.Problem); err == nil {
			out, err = appendJSON(prefixError, r.Problem)
		}
	case KindHeartbeat:
		return append([]byte(nil), prefixHeartbeat...), nil
	case KindReset:
		if err = checkReset(r.Reset); err == nil {
			out, err = appendJSON(prefixReset, r.Reset)
		}
	case KindRetrying:
		if err = checkRetrying(r.Retrying); err == nil {
			out, err = appendJSON(prefixRetrying, r.Retrying)
		}
	default:
		return nil, fmt.Errorf("protocol: encode result: unknown kind %d", r.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("protocol: encode %s: %w", r.Kind, err)
	}
	if len(out) > MaxResultBytes {
		return nil, fmt.Errorf("protocol: encode %s: %d bytes exceeds %d", r.Kind, len(out), MaxResultBytes)
	}
	return out, nil
}

func checkBatch(chunks []Chunk) error {
	if len(chunks) == 0 {
		return errors.New("empty batch")
	}
	for i, c := range chunks {
		if c.Seq < 1 {
			return fmt.Errorf("batch chunk %d has seq %d", i, c.Seq)
		}
		if i > 0 && c.Seq != chunks[i-1].Seq+1 {
			return fmt.Errorf("batch seq %d follows %d", c.Seq, chunks[i-1].Seq)
		}
	}
	return nil
}

func checkProblem(p *Problem) error {
	if p == nil || p.Type == "" || p.Status < 400 || p.Status > 599 {
		return errors.New("problem needs type and a 4xx/5xx status")
	}
	return nil
}

func checkReset(r *Reset) error {
	if r == nil || r.Attempt < 1 {
		return errors.New("reset needs an attempt of at least 1")
	}
	return nil
}

// MaxRetryingReason bounds the reason of a retrying message: reasons are
// short labels (llm.Reason's set), never error text.
const MaxRetryingReason = 64

func checkRetrying(r *Retrying) error {
	switch {
	case r == nil || r.Attempt < 1:
		return errors.New("retrying needs an attempt of at least 1")
	case r.RetryInSeconds < 0 || r.RetryInSeconds > MaxRetryInSeconds:
		return fmt.Errorf("retrying delay %v is outside [0, %d] seconds", r.RetryInSeconds, MaxRetryInSeconds)
	case r.Reason == "" || len(r.Reason) > MaxRetryingReason:
		return fmt.Errorf("retrying reason must have 1 to %d bytes", MaxRetryingReason)
	}
	for _, c := range []byte(r.Reason) {
		if (c < 'a' || c > 'z') && c != '_' {
			return errors.New("retrying reason must be lower-case letters and underscores")
		}
	}
	return nil
}

// DecodeResult parses one result-channel message. It never panics; any input
// it cannot accept gives an error wrapping ErrMalformed.
func DecodeResult(msg []byte) (Result, error) {
	if len(msg) > MaxResultBytes {
		return Result{}, fmt.Errorf("%w: %d bytes exceeds %d", ErrMalformed, len(msg), MaxResultBytes)
	}
	switch {
	case bytes.HasPrefix(msg, prefixBatch):
		var chunks []Chunk
		if err := strictUnmarshal(msg[len(prefixBatch):], &chunks); err != nil {
			return Result{}, fmt.Errorf("%w: batch: %v", ErrMalformed, err)
		}
		if err := checkBatch(chunks); err != nil {
			return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return Result{Kind: KindBatch, Chunks: chunks}, nil
	case bytes.Equal(msg, prefixHeartbeat):
		return Result{Kind: KindHeartbeat}, nil
	case bytes.Equal(msg, prefixDone):
		return Result{Kind: KindDone}, nil
	case bytes.HasPrefix(msg, prefixDone) && len(msg) > len(prefixDone) && msg[len(prefixDone)] == ':':
		var d Done
		if err := strictUnmarshal(msg[len(prefixDone)+1:], &d); err != nil {
			return Result{}, fmt.Errorf("%w: done: %v", ErrMalformed, err)
		}
		return Result{Kind: KindDone, Done: &d}, nil
	case bytes.HasPrefix(msg, prefixError):
		var p Problem
		if err := strictUnmarshal(msg[len(prefixError):], &p); err != nil {
			return Result{}, fmt.Errorf("%w: error: %v", ErrMalformed, err)
		}
		if err := checkProblem(&p); err != nil {
			return Result{}, fmt.Errorf("%w: error: %v", ErrMalformed, err)
		}
		return Result{Kind: KindError, Problem: &p}, nil
	case bytes.HasPrefix(msg, prefixReset):
		var r Reset
		if err := strictUnmarshal(msg[len(prefixReset):], &r); err != nil {
			return Result{}, fmt.Errorf("%w: reset: %v", ErrMalformed, err)
		}
		if err := checkReset(&r); err != nil {
			return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return Result{Kind: KindReset, Reset: &r}, nil
	case bytes.HasPrefix(msg, prefixRetrying):
		var r Retrying
		if err := strictUnmarshal(msg[len(prefixRetrying):], &r); err != nil {
			return Result{}, fmt.Errorf("%w: retrying: %v", ErrMalformed, err)
		}
		if err := checkRetrying(&r); err != nil {
			return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return Result{Kind: KindRetrying, Retrying: &r}, nil
	}
	return Result{}, fmt.Errorf("%w: unknown prefix", ErrMalformed)
}

// strictUnmarshal decodes exactly one JSON value with nothing but white
// space after it. json.Unmarshal checks the whole input before decoding; a
// Decoder followed by More and Token let a stray `}` or `]`, or any tail
// that is not itself a JSON value, through.
func strictUnmarshal(b []byte, v any) error {
	return json.Unmarshal(b, v)
}

// appendJSON appends v as JSON to a copy of prefix. HTML characters stay as
// they are: json.Marshal would write each `<`, `>` and `&` as six bytes,
// and model output is full of them.
func appendJSON(prefix []byte, v any) ([]byte, error) {
	buf := bytes.NewBuffer(append([]byte(nil), prefix...))
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
