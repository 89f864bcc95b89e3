package stream

import (
	"errors"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// queued hands the request to the queue and relays what the workers
// publish (docs/ARCHITECTURE.md, "Queued path"). The relay is subscribed
// before the job is enqueued.
func (h *Handler) queued(x *exchange) {
	if p := h.gate.MayQueue(x.prio); p != nil {
		h.refuse(x, p, protocol.PathQueued)
		return
	}
	relay, err := h.spill.Spill(x.r.Context(), protocol.Job{
		RequestID: x.requestID, UserID: x.user, ThreadID: x.req.ThreadID, SessionID: x.session,
		Payload: x.req, Priority: x.prio,
	})
	if err != nil {
		var p *protocol.Problem
		if !errors.As(err, &p) {
			h.log.Error("queue refused job", "request_id", x.requestID, "err", err)
			p = protocol.QueueUnavailable(h.retryAfter())
		}
		h.refuse(x, p, protocol.PathQueued)
		return
	}
	finished := false
	// Close runs on every exit: a job whose client left is skipped or
	// cancelled by the workers.
	defer func() { relay.Close(finished) }()
	s := h.sessionOf(x, protocol.PathQueued)
	s.frames, s.relayDone, s.relayProblem = relay.Results(), relay.Done(), relay.Problem
	s.position = h.newPosition()
	_, finished = s.serve(x.r.Context())
}
