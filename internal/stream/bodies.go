package stream

import (
	"errors"
	"io"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// bodyBudget bounds the request-body bytes the handler reads or holds at
// once, over every request (BODY_BYTES_IN_FLIGHT, docs/OPERATIONS.md,
// "Request bodies in flight"). It never waits: a request whose body does
// not fit is refused at once (503 bodies-in-flight), so a burst of large
// bodies cannot take the process's memory. A nil budget bounds nothing.
type bodyBudget struct {
	sem  *semaphore.Weighted
	held atomic.Int64 // bytes taken and not given back, for BodyBytesHeld
}

func newBodyBudget(limit int64) *bodyBudget {
	if limit <= 0 {
		return nil
	}
	return &bodyBudget{sem: semaphore.NewWeighted(limit)}
}

// take reserves n bytes if they fit.
func (b *bodyBudget) take(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if !b.sem.TryAcquire(n) {
		return false
	}
	b.held.Add(n)
	return true
}

// give returns n bytes taken before.
func (b *bodyBudget) give(n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.held.Add(-n)
	b.sem.Release(n)
}

// BodyBytesHeld is the request-body bytes the handler reads or holds now,
// within Config.BodyBytesInFlight; zero without a bound.
func (h *Handler) BodyBytesHeld() int64 {
	if h.bodies == nil {
		return 0
	}
	return h.bodies.held.Load()
}

// bodiesRetryAfter is the Retry-After of a bodies-in-flight refusal, in
// seconds: bodies are given back as fast as requests are read and
// enqueued, so the room comes back within about a second.
const bodiesRetryAfter = 1

// errBodyBudget ends the read of a body of unknown length whose next bytes
// do not fit the budget.
var errBodyBudget = errors.New("stream: request bodies in flight over BODY_BYTES_IN_FLIGHT")

// budgetReader takes from the budget each piece of a body of unknown
// length (chunked) as it is read, adding it to *held.
type budgetReader struct {
	r    io.Reader
	b    *bodyBudget
	held *atomic.Int64
}

func (br *budgetReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	if n > 0 {
		if !br.b.take(int64(n)) {
			return 0, errBodyBudget
		}
		br.held.Add(int64(n))
	}
	return n, err
}

// releaseBody gives x's body back: its bytes leave the budget, and the
// request keeps no reference to them. It is called as soon as the body is
// no longer needed: on a refusal, once a queued job is enqueued, once a
// direct answer ended; and by serve, for whatever path missed it. A
// direct request handed to the queue gives its bytes back at the hand-off
// (directProducer.handOff), from the direct call's goroutine: the budget
// share is taken by whichever comes first (bodyHeld's Swap), once.
func (h *Handler) releaseBody(x *exchange) {
	if x == nil {
		return
	}
	h.giveBody(&x.bodyHeld)
	x.req.Body, x.req.Messages = nil, nil
}

// giveBody gives back the budget share *held counts, exactly once however
// many goroutines call it.
func (h *Handler) giveBody(held *atomic.Int64) {
	h.bodies.give(held.Swap(0))
}
