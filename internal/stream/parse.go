package stream

import (
	"errors"
	"io"
	"mime"
	"net/http"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// parseRequest authenticates and reads the request: it returns the
// decoded body with the caller's identity, or the problem to refuse it
// with.
func (h *Handler) parseRequest(w http.ResponseWriter, r *http.Request) (protocol.ChatRequest, string, *protocol.Problem) {
	user, prob := h.identity(r)
	if prob != nil {
		return protocol.ChatRequest{}, "", prob
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return protocol.ChatRequest{}, "", protocol.UnsupportedMedia()
	}
	if r.ContentLength > h.cfg.MaxBodyBytes {
		return protocol.ChatRequest{}, "", protocol.BodyTooLarge(h.cfg.MaxBodyBytes)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return protocol.ChatRequest{}, "", protocol.BodyTooLarge(h.cfg.MaxBodyBytes)
		}
		return protocol.ChatRequest{}, "", protocol.BadRequest("The request body could not be read.")
	}
	req, err := protocol.DecodeChatRequest(body, h.cfg.Limits)
	if err != nil {
		// DecodeChatRequest's errors are written for the client.
		return protocol.ChatRequest{}, "", protocol.BadRequest(err.Error())
	}
	return req, user, nil
}
