package stream

import (
	"errors"
	"net/http"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// queued hands the request to the queue and relays what the workers
// publish (docs/ARCHITECTURE.md, "Queued path"). The relay is subscribed
// before the job is enqueued.
func (h *Handler) queued(w http.ResponseWriter, r *http.Request, req protocol.ChatRequest, requestID, user string, start time.Time) {
	instance := instanceOf(requestID)
	if p := h.gate.MayQueue(); p != nil {
		h.refuse(w, p, instance, protocol.PathQueued)
		return
	}
	relay, err := h.spill.Spill(r.Context(), protocol.Job{
		RequestID: requestID, UserID: user, ThreadID: req.ThreadID, Payload: req,
	})
	if err != nil {
		var p *protocol.Problem
		if !errors.As(err, &p) {
			h.log.Error("queue refused job", "request_id", requestID, "err", err)
			p = protocol.QueueUnavailable(h.retryAfter())
		}
		h.refuse(w, p, instance, protocol.PathQueued)
		return
	}
	finished := false
	// Close runs on every exit: a job whose client left is skipped or
	// cancelled by the workers.
	defer func() { relay.Close(finished) }()
	s := h.newSession(w, requestID, user, protocol.PathQueued, start)
	s.frames, s.relayDone, s.relayProblem = relay.Results(), relay.Done(), relay.Problem
	s.position = h.newPosition()
	_, finished = s.serve(r.Context())
}
