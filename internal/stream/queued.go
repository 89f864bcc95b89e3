package stream

import (
	"errors"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// queued hands the request to the queue (docs/ARCHITECTURE.md, "Queued
// path") and returns the session that relays what the workers publish,
// or nil when the request was refused (and answered). The relay is
// subscribed before the job is enqueued; the session closes it when the
// stream ends, and a job whose client left is then skipped or cancelled
// by the workers. The caller serves the session: its frames, not this
// one's, are under the stream while it waits (see Handler.serve).
//
//go:noinline
func (h *Handler) queued(x *exchange) *session {
	if p := h.gate.MayQueue(x.prio); p != nil {
		h.refuse(x, p, protocol.PathQueued)
		return nil
	}
	relay, err := h.spill.Spill(x.r.Context(), protocol.Job{
		RequestID: x.requestID, UserID: x.user, ThreadID: x.req.ThreadID, SessionID: x.session,
		Payload: x.req, Priority: x.prio,
	})
	// Enqueued or refused, the body is the queue's now: what the stream
	// keeps while it waits must not include it.
	h.releaseBody(x)
	if err != nil {
		var p *protocol.Problem
		if !errors.As(err, &p) {
			h.log.Error("queue refused job", "request_id", x.requestID, "err", err)
			p = protocol.QueueUnavailable(h.retryAfter())
		}
		h.refuse(x, p, protocol.PathQueued)
		return nil
	}
	s := h.sessionOf(x, protocol.PathQueued)
	s.src = relaySource(relay)
	s.position = h.newPosition()
	if h.cfg.TakeOverAfter < 0 {
		h.takeOver(s, x.r)
	} else {
		s.req = x.r // taken over if the stream waits (session.mayTakeOver)
	}
	return s
}
