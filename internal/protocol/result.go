package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// MaxResultBytes bounds one result-channel message; larger ones are refused
// by DecodeResult. A whole answer (POST /v1/embeddings, /v1/completions)
// travels as one raw chunk in one message, so the bound is set for a
// batch of embeddings (a 3072-dimension vector is about 60 KiB of JSON):
// 16 MiB, where Redis's Pub/Sub output buffer limits are far above.
const MaxResultBytes = 16 << 20

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
// it (docs/QUEUE.md, "Result messages"). Fenced forms carry the attempt
// that wrote them: `BATCH:{attempt}:[…]`, `SIGNAL:DONE:{attempt}:{chunks}[:{json}]`,
// `SIGNAL:ERROR:{attempt}:{problem}`, `SIGNAL:HEARTBEAT:{attempt}`,
// `SIGNAL:RETRYING:{attempt}:{json}` and `SIGNAL:RESET:{json}` (whose JSON
// holds the attempt). The unfenced forms of earlier workers, `BATCH:[…]`,
// `SIGNAL:DONE[:{json}]`, `SIGNAL:ERROR:{problem}`, `SIGNAL:HEARTBEAT` and
// `SIGNAL:RETRYING:{json}`, still decode, with Attempt 0.
type Result struct {
	Kind ResultKind
	// Attempt is the fencing token of the delivery that wrote the message
	// (failover.Delivery.Attempt), at least 1; 0 for an unfenced message.
	// For KindReset it is Reset.Attempt (EncodeResult also takes 0 there).
	Attempt int
	// Count is, for a fenced KindDone, how many chunks the attempt's
	// answer has since its last reset: the relay checks it received them
	// all before it lets `done` through.
	Count    int
	Chunks   []Chunk   // KindBatch
	Done     *Done     // KindDone, may be nil
	Problem  *Problem  // KindError
	Reset    *Reset    // KindReset
	Retrying *Retrying // KindRetrying
}

// MaxAttempt bounds the attempt of a fenced message; nine digits keep the
// header parse simple and no job is delivered a billion times.
const MaxAttempt = 999_999_999

// MaxCount bounds the chunk count of a fenced SIGNAL:DONE.
const MaxCount = 999_999_999

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
	if r.Attempt < 0 || r.Attempt > MaxAttempt || r.Count < 0 || r.Count > MaxCount {
		return nil, fmt.Errorf("protocol: encode %s: attempt %d or count %d out of range", r.Kind, r.Attempt, r.Count)
	}
	if r.Attempt == 0 && r.Count != 0 {
		return nil, fmt.Errorf("protocol: encode %s: a count needs an attempt", r.Kind)
	}
	// fenced appends "{attempt}:" to prefix when the result carries one.
	fenced := func(prefix []byte) []byte {
		b := append([]byte(nil), prefix...)
		if r.Attempt > 0 {
			b = append(strconv.AppendInt(b, int64(r.Attempt), 10), ':')
		}
		return b
	}
	switch r.Kind {
	case KindBatch:
		if err = checkBatch(r.Chunks); err == nil {
			out = appendBatch(append(make([]byte, 0, batchLen(r.Chunks)), fenced(prefixBatch)...), r.Chunks)
		}
	case KindDone:
		head := append([]byte(nil), prefixDone...)
		if r.Attempt > 0 {
			head = append(head, ':')
			head = strconv.AppendInt(head, int64(r.Attempt), 10)
			head = append(head, ':')
			head = strconv.AppendInt(head, int64(r.Count), 10)
		}
		if r.Done == nil {
			return head, nil
		}
		out, err = appendJSON(append(head, ':'), r.Done)
	case KindError:
		if err = checkProblem(r.Problem); err == nil {
			out, err = appendJSON(fenced(prefixError), r.Problem)
		}
	case KindHeartbeat:
		if r.Attempt == 0 {
			return append([]byte(nil), prefixHeartbeat...), nil
		}
		return strconv.AppendInt(append(append([]byte(nil), prefixHeartbeat...), ':'), int64(r.Attempt), 10), nil
	case KindReset:
		if err = checkReset(r.Reset); err == nil && r.Attempt != 0 && r.Attempt != r.Reset.Attempt {
			err = fmt.Errorf("attempt %d differs from the reset's %d", r.Attempt, r.Reset.Attempt)
		}
		if err == nil {
			out, err = appendJSON(prefixReset, r.Reset)
		}
	case KindRetrying:
		// Fenced like the others: the `attempt` inside the JSON counts
		// provider calls, the header the delivery that made them.
		if err = checkRetrying(r.Retrying); err == nil {
			out, err = appendJSON(fenced(prefixRetrying), r.Retrying)
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
		if c.Raw != nil && !rawChunkOK(c.Raw) {
			return fmt.Errorf("batch chunk %d: raw is not one compact JSON object", c.Seq)
		}
	}
	return nil
}

// rawChunkOK reports whether raw is a JSON object on one line, as an
// SSE data line carries it.
func rawChunkOK(raw []byte) bool {
	return len(raw) > 1 && raw[0] == '{' && bytes.IndexByte(raw, '\n') < 0 && bytes.IndexByte(raw, '\r') < 0 && json.Valid(raw)
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

// DecodeResult parses one result-channel message, fenced or not. It never
// panics; any input it cannot accept gives an error wrapping ErrMalformed.
func DecodeResult(msg []byte) (Result, error) {
	if len(msg) > MaxResultBytes {
		return Result{}, fmt.Errorf("%w: %d bytes exceeds %d", ErrMalformed, len(msg), MaxResultBytes)
	}
	r, err := decodeResult(msg)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return r, nil
}

func decodeResult(msg []byte) (Result, error) {
	switch {
	case bytes.HasPrefix(msg, prefixBatch):
		rest := msg[len(prefixBatch):]
		attempt, rest, err := fence(rest)
		if err != nil {
			return Result{}, fmt.Errorf("batch: %v", err)
		}
		chunks, ok := decodeBatchFast(rest)
		if !ok {
			if chunks, err = decodeBatchFull(rest); err != nil {
				return Result{}, fmt.Errorf("batch: %v", err)
			}
		}
		if err := checkBatch(chunks); err != nil {
			return Result{}, err
		}
		return Result{Kind: KindBatch, Attempt: attempt, Chunks: chunks}, nil
	case bytes.Equal(msg, prefixHeartbeat):
		return Result{Kind: KindHeartbeat}, nil
	case bytes.HasPrefix(msg, prefixHeartbeat) && len(msg) > len(prefixHeartbeat) && msg[len(prefixHeartbeat)] == ':':
		attempt, rest, ok := number(msg[len(prefixHeartbeat)+1:], MaxAttempt)
		if !ok || attempt < 1 || len(rest) != 0 {
			return Result{}, errors.New("heartbeat: bad attempt")
		}
		return Result{Kind: KindHeartbeat, Attempt: attempt}, nil
	case bytes.Equal(msg, prefixDone):
		return Result{Kind: KindDone}, nil
	case bytes.HasPrefix(msg, prefixDone) && len(msg) > len(prefixDone) && msg[len(prefixDone)] == ':':
		rest := msg[len(prefixDone)+1:]
		var r Result
		r.Kind = KindDone
		if len(rest) > 0 && rest[0] >= '0' && rest[0] <= '9' {
			var ok bool
			r.Attempt, rest, ok = number(rest, MaxAttempt)
			if !ok || r.Attempt < 1 || len(rest) == 0 || rest[0] != ':' {
				return Result{}, errors.New("done: bad attempt")
			}
			r.Count, rest, ok = number(rest[1:], MaxCount)
			if !ok {
				return Result{}, errors.New("done: bad count")
			}
			if len(rest) == 0 {
				return r, nil
			}
			if rest[0] != ':' {
				return Result{}, errors.New("done: bad count")
			}
			rest = rest[1:]
		}
		var d Done
		if err := strictUnmarshal(rest, &d); err != nil {
			return Result{}, fmt.Errorf("done: %v", err)
		}
		r.Done = &d
		return r, nil
	case bytes.HasPrefix(msg, prefixError):
		attempt, rest, err := fence(msg[len(prefixError):])
		if err != nil {
			return Result{}, fmt.Errorf("error: %v", err)
		}
		var p Problem
		if err := strictUnmarshal(rest, &p); err != nil {
			return Result{}, fmt.Errorf("error: %v", err)
		}
		if err := checkProblem(&p); err != nil {
			return Result{}, fmt.Errorf("error: %v", err)
		}
		return Result{Kind: KindError, Attempt: attempt, Problem: &p}, nil
	case bytes.HasPrefix(msg, prefixReset):
		var r Reset
		if err := strictUnmarshal(msg[len(prefixReset):], &r); err != nil {
			return Result{}, fmt.Errorf("reset: %v", err)
		}
		if err := checkReset(&r); err != nil {
			return Result{}, err
		}
		if r.Attempt > MaxAttempt {
			return Result{}, fmt.Errorf("reset attempt %d exceeds %d", r.Attempt, MaxAttempt)
		}
		return Result{Kind: KindReset, Attempt: r.Attempt, Reset: &r}, nil
	case bytes.HasPrefix(msg, prefixRetrying):
		attempt, rest, err := fence(msg[len(prefixRetrying):])
		if err != nil {
			return Result{}, fmt.Errorf("retrying: %v", err)
		}
		var r Retrying
		if err := strictUnmarshal(rest, &r); err != nil {
			return Result{}, fmt.Errorf("retrying: %v", err)
		}
		if err := checkRetrying(&r); err != nil {
			return Result{}, err
		}
		return Result{Kind: KindRetrying, Attempt: attempt, Retrying: &r}, nil
	}
	return Result{}, errors.New("unknown prefix")
}

// decodeBatchFull decodes a BATCH array of any shape.
func decodeBatchFull(b []byte) ([]Chunk, error) {
	var chunks []Chunk
	err := strictUnmarshal(b, &chunks)
	return chunks, err
}

// fence reads the optional "{attempt}:" header in front of a JSON payload.
// JSON starts with `[` or `{`, never a digit, so a digit means a header;
// no header gives attempt 0 (an unfenced message of an earlier worker).
func fence(b []byte) (int, []byte, error) {
	if len(b) == 0 || b[0] < '0' || b[0] > '9' {
		return 0, b, nil
	}
	attempt, rest, ok := number(b, MaxAttempt)
	if !ok || attempt < 1 || len(rest) == 0 || rest[0] != ':' {
		return 0, nil, errors.New("bad attempt header")
	}
	return attempt, rest[1:], nil
}

// number reads a decimal of at most nine digits, without a leading zero
// (except "0" itself) and at most limit, from the front of b.
func number(b []byte, limit int) (int, []byte, bool) {
	n, i := 0, 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		if i == 9 || (i == 1 && b[0] == '0') {
			return 0, nil, false
		}
		n = n*10 + int(b[i]-'0')
		i++
	}
	if i == 0 || n > limit {
		return 0, nil, false
	}
	return n, b[i:], true
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
