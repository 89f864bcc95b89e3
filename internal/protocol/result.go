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
	}
	return "unknown"
}

// Result is one message on a request's result channel, as a worker publishes
// it: `BATCH:[…]`, `SIGNAL:DONE[:{json}]`, `SIGNAL:ERROR:{problem}`,
// `SIGNAL:HEARTBEAT` or `SIGNAL:RESET:{json}`.
type Result struct {
	Kind    ResultKind
	Chunks  []Chunk  // KindBatch
	Done    *Done    // KindDone, may be nil
	Problem *Problem // KindError
	Reset   *Reset   // KindReset
}

// ErrMalformed is wrapped by every decoding error of this package.
var ErrMalformed = errors.New("protocol: malformed message")

var (
	prefixBatch     = []byte("BATCH:")
	prefixDone      = []byte("SIGNAL:DONE")
	prefixError     = []byte("SIGNAL:ERROR:")
	prefixHeartbeat = []byte("SIGNAL:HEARTBEAT")
	prefixReset     = []byte("SIGNAL:RESET:")
)

// EncodeResult returns the wire form of r.
func EncodeResult(r Result) ([]byte, error) {
	switch r.Kind {
	case KindBatch:
		if len(r.Chunks) == 0 {
			return nil, fmt.Errorf("protocol: encode batch: no chunks")
		}
		b, err := json.Marshal(r.Chunks)
		if err != nil {
			return nil, fmt.Errorf("protocol: encode batch: %w", err)
		}
		return append(append([]byte(nil), prefixBatch...), b...), nil
	case KindDone:
		if r.Done == nil {
			return append([]byte(nil), prefixDone...), nil
		}
		b, err := json.Marshal(r.Done)
		if err != nil {
			return nil, fmt.Errorf("protocol: encode done: %w", err)
		}
		out := append(append([]byte(nil), prefixDone...), ':')
		return append(out, b...), nil
	case KindError:
		if r.Problem == nil {
			return nil, fmt.Errorf("protocol: encode error: no problem")
		}
		b, err := json.Marshal(r.Problem)
		if err != nil {
			return nil, fmt.Errorf("protocol: encode error: %w", err)
		}
		return append(append([]byte(nil), prefixError...), b...), nil
	case KindHeartbeat:
		return append([]byte(nil), prefixHeartbeat...), nil
	case KindReset:
		if r.Reset == nil {
			return nil, fmt.Errorf("protocol: encode reset: no payload")
		}
		b, err := json.Marshal(r.Reset)
		if err != nil {
			return nil, fmt.Errorf("protocol: encode reset: %w", err)
		}
		return append(append([]byte(nil), prefixReset...), b...), nil
	}
	return nil, fmt.Errorf("protocol: encode result: unknown kind %d", r.Kind)
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
		if len(chunks) == 0 {
			return Result{}, fmt.Errorf("%w: empty batch", ErrMalformed)
		}
		for i, c := range chunks {
			if c.Seq < 1 {
				return Result{}, fmt.Errorf("%w: batch chunk %d has seq %d", ErrMalformed, i, c.Seq)
			}
			if i > 0 && c.Seq != chunks[i-1].Seq+1 {
				return Result{}, fmt.Errorf("%w: batch seq %d follows %d", ErrMalformed, c.Seq, chunks[i-1].Seq)
			}
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
		if p.Type == "" || p.Status < 400 || p.Status > 599 {
			return Result{}, fmt.Errorf("%w: error: problem needs type and a 4xx/5xx status", ErrMalformed)
		}
		return Result{Kind: KindError, Problem: &p}, nil
	case bytes.HasPrefix(msg, prefixReset):
		var r Reset
		if err := strictUnmarshal(msg[len(prefixReset):], &r); err != nil {
			return Result{}, fmt.Errorf("%w: reset: %v", ErrMalformed, err)
		}
		if r.Attempt < 1 {
			return Result{}, fmt.Errorf("%w: reset attempt %d", ErrMalformed, r.Attempt)
		}
		return Result{Kind: KindReset, Reset: &r}, nil
	}
	return Result{}, fmt.Errorf("%w: unknown prefix", ErrMalformed)
}

// strictUnmarshal decodes exactly one JSON value with nothing after it.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	if _, err := dec.Token(); err == nil {
		return errors.New("trailing data")
	}
	return nil
}
