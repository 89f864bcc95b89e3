package stream

import (
	"github.com/spillway-dev/spillway/internal/protocol"
)

// priority reads X-Priority (docs/API.md, "Priority"): none is normal,
// a value other than high, normal or low is a 400, and an ask above the
// caller's maximum is lowered to it rather than refused, so a client that
// always asks for high still gets served.
func (h *Handler) priority(x *exchange) (protocol.Priority, *protocol.Problem) {
	ask := protocol.PriorityNormal
	if v, ok := x.r.Header["X-Priority"]; ok {
		if len(v) != 1 {
			return "", protocol.BadRequest("Send X-Priority at most once: high, normal or low.")
		}
		p, err := protocol.ParsePriority(v[0])
		if err != nil {
			return "", protocol.BadRequest("X-Priority must be high, normal or low.")
		}
		ask = p
	}
	return ask.AtMost(h.priorityMax(x)), nil
}

// priorityMax is the highest priority the caller may ask for: its API
// key's maximum (API_KEYS entries such as key=high) when it has one, else
// PRIORITY_MAX.
func (h *Handler) priorityMax(x *exchange) protocol.Priority {
	if m := protocol.Priority(x.id.MaxPriority); m != "" {
		return m
	}
	return h.cfg.PriorityMax
}
