package stream

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// direct streams from the provider in this process while holding lease
// (docs/ARCHITECTURE.md, "Direct path"), through res when the provider
// reserved capacity for it (reserveUpstream). A retryable failure before
// the first chunk is handed to the queue on the same response (handOff):
// the session's source becomes the queue's relay.
func (h *Handler) direct(x *exchange, lease pool.Lease, res llm.Reservation) {
	release := sync.OnceFunc(lease.Release)
	defer release()
	// The provider call outlives the request when the client leaves
	// within a resume window; the session cancels it when the stream ends.
	ctx, cancel := context.WithCancel(x.caller(context.WithoutCancel(x.r.Context())))
	frames := make(chan protocol.Result, h.cfg.FrameBuffer)
	p := &directProducer{h: h, req: x.req, requestID: x.requestID, user: x.user, session: x.session,
		prio: x.prio, release: release, frames: frames, res: res, bodyHeld: &x.bodyHeld, ring: getRing(cap(frames) + 2)}
	// The producer has the request from here on: a hand-off to the queue
	// lets go of its body while the stream goes on (handOff).
	x.req.Body, x.req.Messages = nil, nil
	var producer sync.WaitGroup
	producer.Go(func() { p.run(ctx) })

	began := time.Now()
	s := h.sessionOf(x, protocol.PathDirect)
	s.src = source{frames: frames, next: p}
	outcome, _ := s.serve(x.r.Context())
	held := time.Since(began)
	// The provider call (or the hand-off) ends before the lease is
	// released.
	cancel()
	producer.Wait()
	// Neither the producer nor the session's loop, which ran above, reads
	// the frames any more.
	p.ring.put()
	if p.relay != nil {
		// The stream ended before its session took the hand-off's relay.
		p.relay.Close(false)
	}
	// A handed-off stream held its slot only for the failed call: its
	// length says nothing of how long a slot is held.
	if outcome == OutcomeDone && !p.handedOff.Load() {
		h.gate.ServiceDone(held)
	}
}

// rawSlot is the room each ring slot of the direct path starts with for
// a raw chunk; maxRawSlot the most a slot keeps for the next stream.
const (
	rawSlot    = 256
	maxRawSlot = 4 << 10
)

// directRing is where a direct stream's chunks wait for the write loop:
// each travels in a one-chunk batch whose backing array is a slot of
// chunks, reused once the write loop is done with it; it holds at most
// the frames buffered plus the one being written, and the producer fills
// at most one more before a send blocks. A raw chunk is the provider's
// only until emit returns: each slot copies it into a buffer of its own
// in raws, reused with the slot, cut from one block at the first raw
// chunk (a chunk is about 150 bytes; a longer one grows its slot's
// buffer). Streams take a ring from rings and give it back when they
// end, so its 20 KiB are not allocated per stream
// (docs/bench-history/2026-11.md, "The OpenAI relay's CPU").
type directRing struct {
	chunks []protocol.Chunk
	raws   [][]byte
}

var rings sync.Pool

// getRing returns a ring of n slots.
func getRing(n int) *directRing {
	if r, ok := rings.Get().(*directRing); ok && len(r.chunks) == n {
		return r
	}
	return &directRing{chunks: make([]protocol.Chunk, n)}
}

// raw copies c.Raw into slot i's buffer.
func (r *directRing) raw(i int, c *protocol.Chunk) {
	if r.raws == nil {
		r.raws = make([][]byte, len(r.chunks))
		block := make([]byte, len(r.chunks)*rawSlot)
		for k := range r.raws {
			r.raws[k] = block[k*rawSlot : k*rawSlot : (k+1)*rawSlot]
		}
	}
	r.raws[i] = append(r.raws[i][:0], c.Raw...)
	c.Raw = r.raws[i]
}

// put gives the ring back, once nothing reads its slots: the chunks'
// strings are let go, the raw buffers kept (only their new length is
// ever read), unless one grew large.
func (r *directRing) put() {
	clear(r.chunks)
	for k, b := range r.raws {
		if cap(b) > maxRawSlot {
			r.raws[k] = nil
		}
	}
	rings.Put(r)
}

// directProducer calls the provider and hands each chunk, then a terminal
// done or error, to the write loop over frames.
type directProducer struct {
	h         *Handler
	req       protocol.ChatRequest
	requestID string
	user      string
	session   string
	prio      protocol.Priority
	res       llm.Reservation // capacity the provider holds for the call; nil when none
	release   func()          // releases the slot; idempotent
	// bodyHeld is the request body's share of BODY_BYTES_IN_FLIGHT
	// (exchange.bodyHeld), given back at a hand-off to the queue.
	bodyHeld  *atomic.Int64
	frames    chan<- protocol.Result
	ring      *directRing // where chunks wait for the write loop
	handedOff atomic.Bool
	// relay is the queue's, once handOff spilled the request, until the
	// session takes it (handed).
	relay failover.Relay
}

func (p *directProducer) send(ctx context.Context, res protocol.Result) error {
	select {
	case p.frames <- res:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *directProducer) run(ctx context.Context) {
	h := p.h
	seq := 0
	ring := p.ring.chunks
	call := h.provider.Stream
	if p.res != nil {
		call = p.res.Stream
	}
	route := p.req.Route
	one := func(c protocol.Chunk) error {
		seq++
		c.Seq = seq
		i := seq % len(ring)
		if c.Raw != nil {
			p.ring.raw(i, &c)
		}
		ring[i] = c
		return p.send(ctx, protocol.Result{Kind: protocol.KindBatch, Chunks: ring[i : i+1 : i+1]})
	}
	// Chunks without output (a role preamble) wait for the first that
	// has some: a failure before it stays invisible to the client, so
	// the request can still go to the queue.
	var held []protocol.Chunk
	sendHeld := func() error {
		for _, h := range held {
			if err := one(h); err != nil {
				return err
			}
		}
		held = nil
		return nil
	}
	result, err := call(ctx, p.req, func(c protocol.Chunk) error {
		if !c.NeededBy(route) {
			return nil
		}
		c = c.For(route)
		if seq == 0 && !c.Output() {
			c.Raw = bytes.Clone(c.Raw) // kept past emit
			held = append(held, c)
			return nil
		}
		if err := sendHeld(); err != nil {
			return err
		}
		return one(c)
	})
	if err == nil {
		err = sendHeld()
	}
	if err == nil {
		h.requestEnded(nil)
		usage := result.Usage
		_ = p.send(ctx, protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{
			RequestID: p.requestID, FinishReason: result.FinishReason, Path: protocol.PathDirect, Usage: &usage,
		}})
		return
	}
	if ctx.Err() != nil {
		return // the client left: nobody reads frames
	}
	var le *llm.Error
	switch {
	case seq == 0 && llm.IsClientError(err) && errors.As(err, &le):
		h.log.Info("provider refused the request", "request_id", p.requestID, "path", protocol.PathDirect, "status", le.Status)
		h.requestEnded(err)
		_ = p.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderRejected(le.Status, le.Body)})
		return
	case seq == 0 && llm.IsRetryable(err) && h.spill != nil:
		h.log.Info("provider failed before the first chunk; handing the request to the queue",
			"request_id", p.requestID, "reason", retryReason(err), "err", err)
		p.handOff(ctx, err)
		return
	}
	h.log.Warn("provider failed", "request_id", p.requestID, "path", protocol.PathDirect, "chunks", seq, "err", err)
	h.requestEnded(err)
	// Advise the retry policy's delay when the failure is retryable (an
	// upstream Retry-After, the throttled backoff), else none.
	prob := protocol.ProviderFailed(0)
	if d, ok := h.cfg.Retry.Delay(err, 1); ok {
		prob.RetryAfterSeconds = protocol.RetryAfterSeconds(d)
	}
	_ = p.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: prob})
}

// requestEnded tells Deps.Ended how a request the direct path answered
// ended.
func (h *Handler) requestEnded(err error) {
	if h.ended != nil {
		h.ended(err)
	}
}

// handOff continues a request whose provider call failed retryably before
// its first chunk as a queued request, on the same SSE response
// (docs/API.md, "Hand-off to the queue"): the headers (X-Stream-Path:
// direct) are already out, so the client sees a `retrying` event, then
// what a worker publishes, as on the queued path: the session's loop
// reads the relay in place of this producer (handed). The slot is
// released first: the wait and the queue need none, and the worker takes
// its own.
// The retry starts after the retry policy's delay, so an upstream
// Retry-After is honoured on this path too; the worker then retries on
// its own with a fresh budget.
func (p *directProducer) handOff(ctx context.Context, cause error) {
	h := p.h
	p.handedOff.Store(true)
	p.release()
	delay, _ := h.cfg.Retry.Delay(cause, 1)
	if p.send(ctx, protocol.Result{Kind: protocol.KindRetrying, Retrying: &protocol.Retrying{
		Attempt: 2, RetryInSeconds: delay.Seconds(), Reason: retryReason(cause),
	}}) != nil {
		return
	}
	t := time.NewTimer(delay)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return
	}
	if prob := h.gate.MayQueue(p.prio); prob != nil {
		_ = p.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: prob})
		return
	}
	relay, err := h.spill.Spill(ctx, protocol.Job{
		RequestID: p.requestID, UserID: p.user, ThreadID: p.req.ThreadID, SessionID: p.session,
		Payload: p.req, Priority: p.prio,
	})
	// Enqueued or refused, the body is the queue's now, as on the queued
	// path: the stream that waits for a worker keeps neither its bytes
	// nor their share of BODY_BYTES_IN_FLIGHT (docs/OPERATIONS.md,
	// "Request bodies in flight"). The handler's release after the stream
	// then finds nothing left to give.
	p.req.Body, p.req.Messages = nil, nil
	h.giveBody(p.bodyHeld)
	if err != nil {
		var prob *protocol.Problem
		if !errors.As(err, &prob) {
			h.log.Error("queue refused handed-off job", "request_id", p.requestID, "err", err)
			prob = protocol.QueueUnavailable(h.retryAfter())
		}
		_ = p.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: prob})
		return
	}
	// The session reads the relay itself from here on: closing frames
	// tells it to take the relay (handed), after the frames sent before.
	p.relay = relay
	close(p.frames)
}

// handed gives the session the relay handOff spilled the request to, once
// the producer closed its frames; false when it closed them without one.
// It runs on the session's goroutine, after the close, which orders it
// after handOff's write of p.relay.
func (p *directProducer) handed() (source, bool) {
	r := p.relay
	if r == nil {
		return source{}, false
	}
	p.relay = nil
	return relaySource(r), true
}

// retryReason is the reason of the `retrying` event for err: llm.Reason,
// or circuit_open.
func retryReason(err error) string {
	if llm.IsCircuitOpen(err) {
		return "circuit_open"
	}
	return llm.Reason(err)
}
