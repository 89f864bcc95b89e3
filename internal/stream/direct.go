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
	frames := make(chan protocol.Result, directFrames)
	began := time.Now()
	// The producer writes its chunks to the session itself (inline), once
	// the loop lets go of it: after the response began (session.serve).
	s := h.sessionOf(x, protocol.PathDirect)
	s.inline, s.poke = true, frames
	s.mu.Lock()
	p := &directProducer{h: h, req: x.req, requestID: x.requestID, user: x.user, session: x.session,
		prio: x.prio, release: release, frames: frames, res: res, bodyHeld: &x.bodyHeld, s: s}
	s.src = source{frames: frames, next: p}
	// The producer has the request from here on: a hand-off to the queue
	// lets go of its body while the stream goes on (handOff).
	x.req.Body, x.req.Messages = nil, nil
	var producer sync.WaitGroup
	producer.Go(func() { p.run(ctx) })

	outcome, _ := s.serve(x.r.Context())
	// The loop held s.mu since the producer started, outside its select
	// (session.loop): let go of it as the last thing the stream does.
	// Here, not deferred in serve: serve's frame is under every waiting
	// stream's wait, and a larger one keeps their stacks from shrinking
	// (TestWaitingStreamStacksShrink).
	s.over = true
	s.mu.Unlock()
	held := time.Since(began)
	// The provider call (or the hand-off) ends before the lease is
	// released.
	cancel()
	producer.Wait()
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

// directFrames is the buffer of a direct stream's frames: its producer
// writes its chunks itself (session.chunkInline), so what goes through
// frames is a retrying, then a done or an error, and a write failure's
// wake-up that is dropped when a frame waits already (lostInline): 64
// frames, as it once had, were about 5 KiB allocated for every direct
// stream and never used.
const directFrames = 2

// directProducer calls the provider and writes each chunk to the session
// (session.chunkInline) on the provider's goroutine: a paced chunk wakes
// that goroutine alone, not the session's too. Chunks that one read of
// the upstream brought are gathered and go out in one write before the
// next read (it is the call's llm.ReadWatcher), or each at once from a
// provider that does not say when it reads. What is not a chunk (a
// terminal done or error, a hand-off's retrying) goes to the session's
// loop over frames, after every chunk written.
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
	bodyHeld *atomic.Int64
	frames   chan<- protocol.Result
	s        *session // what the chunks are written to
	// watched: the provider says before each read that may wait
	// (llm.ReadWatcher), so chunks are gathered until then.
	watched bool
	// gathered: a chunk was written since the last sendGathered.
	gathered  bool
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
	call := h.provider.Stream
	if p.res != nil {
		call = p.res.Stream
	}
	route := p.req.Route
	one := func(c protocol.Chunk) error {
		seq++
		c.Seq = seq
		p.gathered = p.gathered || p.watched
		return p.s.chunkInline(c, p.watched)
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
	result, err := call(llm.WithReadWatcher(ctx, p), p.req, func(c protocol.Chunk) error {
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
	// What the last read brought goes out before the terminal frame.
	p.s.sendGathered()
	if errors.Is(err, errSessionOver) {
		return // the stream ended: nobody reads frames
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

// Reading notes whether the provider says when it reads (llm.ReadWatcher).
func (p *directProducer) Reading(on bool) { p.watched = on }

// BeforeRead sends the chunks gathered since the last read
// (llm.ReadWatcher).
func (p *directProducer) BeforeRead() {
	if p.gathered {
		p.gathered = false
		p.s.sendGathered()
	}
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
