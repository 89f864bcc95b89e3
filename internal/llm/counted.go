package llm

import (
	"context"
	"errors"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// CountResponses wraps p so that count is called once per call that got a
// response from the upstream, with ResponseCode's label: the value of
// spillway_upstream_responses_total{upstream,code} (docs/TIMEOUTS.md). A call that
// got no response (refused connection, timeout before the headers, the
// caller's cancellation before any) is not counted. It is the one place
// that counts, so that the direct path and the workers agree; put it
// beneath the circuit breaker, so that calls the open circuit refused
// without trying are not counted either.
func CountResponses(p Provider, count func(code string)) Provider {
	return &counted{p: p, count: count}
}

type counted struct {
	p     Provider
	count func(code string)
}

func (c *counted) Name() string { return c.p.Name() }

func (c *counted) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (Result, error) {
	res, err := c.p.Stream(ctx, req, emit)
	if code, ok := ResponseCode(err); ok {
		c.count(code)
	}
	return res, err
}

// Call is one finished provider call as Observe reports it.
type Call struct {
	// Err is what the call returned; nil for a complete answer.
	Err error
	// FirstChunk is the time from the call to its first chunk, when
	// Chunks is set.
	FirstChunk time.Duration
	// Chunks reports that at least one chunk arrived.
	Chunks bool
}

// Throttled reports whether the upstream answered the call with 429 or
// 503, the signals of an upstream at its capacity (ResponseCode's
// classification; ErrNoCapacity, which no upstream said, is not one).
func (c Call) Throttled() bool {
	code, ok := ResponseCode(c.Err)
	return ok && (code == "429" || code == "503")
}

// Counted reports whether the call counts in an error rate: it was not
// cancelled by its caller, and a provider was asked: not ErrNoCapacity,
// nor a refusal by an open circuit (IsCircuitOpen, which the
// several-upstreams balancer returns when every circuit is open).
func (c Call) Counted() bool {
	return !errors.Is(c.Err, context.Canceled) && !errors.Is(c.Err, ErrNoCapacity) && !IsCircuitOpen(c.Err)
}

// Failed reports whether a counted call failed for a reason the provider
// owns: timeouts, 429 and 5xx, refused connections, streams cut short,
// unreadable answers, 401/403. A client error (IsClientError) or an error
// of emit is the caller's, not the provider's.
func (c Call) Failed() bool {
	if c.Err == nil || !c.Counted() {
		return false
	}
	var e *Error
	return isTimeout(c.Err) || (errors.As(c.Err, &e) && !IsClientError(c.Err))
}

// Observe wraps p so that observe is called once per call, after it ends,
// with its outcome and first-chunk latency: the input of adaptive
// concurrency and of the degradation level's error rate. observe runs on
// the caller's goroutine and must not block. When p is a Reserver the
// wrapper is one too, and a call made through a Reservation is observed
// like any other.
func Observe(p Provider, observe func(Call)) Provider {
	o := &observed{p: p, observe: observe}
	if r, ok := p.(Reserver); ok {
		return &observedReserver{observed: o, r: r}
	}
	return o
}

type observed struct {
	p       Provider
	observe func(Call)
}

func (o *observed) Name() string { return o.p.Name() }

func (o *observed) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (Result, error) {
	return o.call(ctx, req, emit, o.p.Stream)
}

// call makes one call through stream and observes it.
func (o *observed) call(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error,
	stream func(context.Context, protocol.ChatRequest, func(protocol.Chunk) error) (Result, error)) (Result, error) {
	start := time.Now()
	var c Call
	res, err := stream(ctx, req, func(ch protocol.Chunk) error {
		// A role-only preamble, as some servers send before the model
		// ran, is no first chunk.
		if !c.Chunks && ch.Output() {
			c.Chunks, c.FirstChunk = true, time.Since(start)
		}
		return emit(ch)
	})
	c.Err = err
	o.observe(c)
	return res, err
}

// observedReserver is Observe's wrapper of a Reserver.
type observedReserver struct {
	*observed
	r Reserver
}

// Reserve reserves on the wrapped Reserver; the reservation's call is
// observed. A reservation refused for lack of capacity is no call.
func (o *observedReserver) Reserve(ctx context.Context, req protocol.ChatRequest) (Reservation, error) {
	res, err := o.r.Reserve(ctx, req)
	if err != nil {
		return nil, err
	}
	return &observedReservation{o: o.observed, res: res}, nil
}

type observedReservation struct {
	o   *observed
	res Reservation
}

func (r *observedReservation) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (Result, error) {
	return r.o.call(ctx, req, emit, r.res.Stream)
}

func (r *observedReservation) Release() { r.res.Release() }
