package stream

import (
	"net/http"
	"time"
)

// newSession returns the session of a /v1/stream stream; the caller fills
// in its source.
func (h *Handler) newSession(w http.ResponseWriter, requestID, owner, path string, start time.Time) *session {
	return &session{h: h, sink: openNative(w, h.cfg.WriteTimeout), resumable: true,
		requestID: requestID, owner: owner, path: path, start: start}
}
