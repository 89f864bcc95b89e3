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

func (c *counted) Stream(ctx context.Context, req protocol.ChatRequest, emit func(content string) error) (Result, error) {
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
// nor a refusal by an open circuit (an error with CircuitOpen() true,
// which the several-upstreams balancer returns when every circuit is
// open).
func (c Call) Counted() bool {
	var co interface{ CircuitOpen() bool }
	return !errors.Is(c.Err, context.Canceled) && !errors.Is(c.Err, ErrNoCapacity) &&
		!(errors.As(c.Err, &co) && co.CircuitOpen())
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
// the caller's goroutine and must not block.
func Observe(p Provider, observe func(Call)) Provider {
	return &observed{p: p, observe: observe}
}

type observed struct {
	p       Provider
	observe func(Call)
}

func (o *observed) Name() string { return o.p.Name() }

func (o *observed) Stream(ctx context.Context, req protocol.ChatRequest, emit func(content string) error) (Result, error) {
	start := time.Now()
	var c Call
	res, err := o.p.Stream(ctx, req, func(content string) error {
		if !c.Chunks {
			c.Chunks, c.FirstChunk = true, time.Since(start)
		}
		return emit(content)
	})
	c.Err = err
	o.observe(c)
	return res, err
}
