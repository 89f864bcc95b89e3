package stream

import (
	"context"
	"errors"
	"net/http"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// reserveUpstream holds capacity on a provider that has its own (several
// capped upstreams, llm.Reserver) before the request commits to the
// direct path: with a pool slot but no upstream that can take the call,
// the request goes to the queue, or without one is refused, exactly as
// when the pool is full (false).
// Any other error is left to the provider call to meet and report; the
// reservation is then nil, as for a provider without capacity of its own.
func (h *Handler) reserveUpstream(x *exchange) (llm.Reservation, bool) {
	rp, ok := h.provider.(llm.Reserver)
	if !ok {
		return nil, true
	}
	res, err := rp.Reserve(x.caller(x.r.Context()), x.req)
	if err != nil {
		return nil, !errors.Is(err, llm.ErrNoCapacity)
	}
	return res, true
}

// caller returns ctx carrying whom the provider call is for
// (llm.WithCaller): the identity and the X-Session-ID.
func (x *exchange) caller(ctx context.Context) context.Context {
	return llm.WithCaller(ctx, llm.Caller{Identity: x.user, Session: x.session})
}

// sessionID reads X-Session-ID: absent is none; anything but one value of
// 1 to 128 characters of A-Z a-z 0-9 . _ : @ - is a 400.
func sessionID(r *http.Request) (string, *protocol.Problem) {
	v, ok := r.Header["X-Session-Id"]
	if !ok {
		return "", nil
	}
	if len(v) != 1 || !protocol.ValidUserID(v[0]) {
		return "", protocol.BadRequest("X-Session-ID must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -")
	}
	return v[0], nil
}
