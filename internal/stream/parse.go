package stream

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// parseRequest authenticates and reads the request into x: the decoded
// body, the caller's identity and how the answer is written; or it returns
// the problem to refuse it with.
func (h *Handler) parseRequest(x *exchange) *protocol.Problem {
	w, r := x.w, x.r
	id, prob := h.identity(r)
	if prob != nil {
		return prob
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return protocol.UnsupportedMedia()
	}
	if r.ContentLength > h.cfg.MaxBodyBytes {
		return protocol.BodyTooLarge(h.cfg.MaxBodyBytes)
	}
	body, prob := h.readBody(w, r)
	if prob != nil {
		return prob
	}
	req, open, err := x.d.decode(body, h.cfg.Limits)
	if err != nil {
		// The decoders' errors are written for the client.
		return protocol.BadRequest(err.Error())
	}
	// An unknown model is refused here, not sent upstream: the upstream's
	// 404 would cost a call, and on the queued path a job (LLM_MODELS, or
	// the models the upstreams list).
	if (h.models != nil && !h.models[req.Model]) || (h.served != nil && !h.served[req.Model]) {
		return protocol.ModelNotAllowed()
	}
	x.req, x.user, x.id, x.open = req, id.Name, id, open
	return nil
}

// readBody reads the body under MAX_BODY_BYTES and the body read deadline
// (BODY_READ_TIMEOUT_SECONDS): a client that sends headers and part of a
// body must not hold a goroutine, and shutdown, for ever.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *protocol.Problem) {
	rc := http.NewResponseController(w)
	// A writer without deadlines (a test recorder) reads without one.
	deadlineSet := rc.SetReadDeadline(time.Now().Add(h.cfg.BodyReadTimeout)) == nil
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		// The deadline stays: the server must not wait for the rest of a
		// body that did not come, and the connection closes after the
		// answer.
		w.Header().Set("Connection", "close")
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, protocol.BodyTooLarge(h.cfg.MaxBodyBytes)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, protocol.RequestTimeout()
		}
		return nil, protocol.BadRequest("The request body could not be read.")
	}
	if deadlineSet {
		// The stream that follows may last far longer than the body took.
		_ = rc.SetReadDeadline(time.Time{})
	}
	return body, nil
}
