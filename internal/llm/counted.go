package llm

import (
	"context"

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
