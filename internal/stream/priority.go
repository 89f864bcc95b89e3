package stream

import (
	"net/http"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// priority reads X-Priority (docs/API.md, "Priority"): none is normal,
// a value other than high, normal or low is a 400, and an ask above the
// caller's maximum is lowered to it rather than refused, so a client that
// always asks for high still gets served.
func (h *Handler) priority(r *http.Request, user string) (protocol.Priority, *protocol.Problem) {
	ask := protocol.PriorityNormal
	if v, ok := r.Header["X-Priority"]; ok {
		if len(v) != 1 {
			return "", protocol.BadRequest("Send X-Priority at most once: high, normal or low.")
		}
		p, err := protocol.ParsePriority(v[0])
		if err != nil {
			return "", protocol.BadRequest("X-Priority must be high, normal or low.")
		}
		ask = p
	}
	return ask.AtMost(h.priorityMax(user)), nil
}

// priorityMax is the highest priority the caller may ask for. Every
// caller's maximum is PRIORITY_MAX today; this is the one place a
// per-API-key maximum (API_KEYS entries such as key=high) feeds in.
func (h *Handler) priorityMax(string) protocol.Priority { return h.cfg.PriorityMax }
