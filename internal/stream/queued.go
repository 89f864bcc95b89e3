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
func (h *Handler) queued(w http.ResponseWriter, r *http.Request, req protocol.ChatRequest, requestID, user string, prio protocol.Priority, start time.Time) {
	instance := instanceOf(requestID)
	if p := h.gate.MayQueue(prio); p != nil {
		h.refuse(w, p, instance, protocol.PathQueued)
		return
	}
	relay, err := h.spill.Spill(r.Context(), protocol.Job{
		RequestID: requestID, UserID: user, ThreadID: req.ThreadID, Payload: req, Priority: prio,
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
	s := &session{h: h, w: w, requestID: requestID, path: protocol.PathQueued, start: start,
		frames: relay.Results(), relayDone: relay.Done(), relayProblem: relay.Problem}
	_, finished = s.serve(r.Context())
}
