package stream

import (
	"errors"
	"io"
	"mime"
	"net/http"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// parseRequest authenticates and reads the request into x: the decoded
// body, the caller's identity and how the answer is written; or it returns
// the problem to refuse it with.
func (h *Handler) parseRequest(x *exchange) *protocol.Problem {
	w, r := x.w, x.r
	user, prob := h.identity(r)
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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return protocol.BodyTooLarge(h.cfg.MaxBodyBytes)
		}
		return protocol.BadRequest("The request body could not be read.")
	}
	req, open, err := x.d.decode(body, h.cfg.Limits)
	if err != nil {
		// The decoders' errors are written for the client.
		return protocol.BadRequest(err.Error())
	}
	x.req, x.user, x.open = req, user, open
	return nil
}
