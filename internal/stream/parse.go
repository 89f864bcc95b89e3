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
	r := x.r
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
	body, prob := h.readBody(x)
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

// readBody reads the body under MAX_BODY_BYTES, BODY_BYTES_IN_FLIGHT and
// the body read deadline (BODY_READ_TIMEOUT_SECONDS): a client that sends
// headers and part of a body must not hold a goroutine, and shutdown, for
// ever. The bytes it took from the budget are x.bodyHeld, given back by
// releaseBody, even when the read failed.
func (h *Handler) readBody(x *exchange) ([]byte, *protocol.Problem) {
	w, r := x.w, x.r
	// A body of announced length takes its bytes before it is read, so a
	// refusal costs no read; one of unknown length (chunked) takes them as
	// they come.
	rc := http.NewResponseController(w)
	if r.ContentLength > h.cfg.MaxBodyBytes {
		// Refused before a byte is read, and nothing to keep the
		// connection for: it closes after the answer.
		w.Header().Set("Connection", "close")
		return nil, protocol.BodyTooLarge(h.cfg.MaxBodyBytes)
	}
	if r.ContentLength > 0 && !h.bodies.take(r.ContentLength) {
		h.discardBody(w, r, rc)
		return nil, protocol.BodiesInFlight(bodiesRetryAfter)
	}
	if r.ContentLength > 0 {
		x.bodyHeld.Store(r.ContentLength)
	}
	// A writer without deadlines (a test recorder) reads without one.
	deadlineSet := rc.SetReadDeadline(time.Now().Add(h.cfg.BodyReadTimeout)) == nil
	src := io.Reader(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	var body []byte
	var err error
	if r.ContentLength >= 0 {
		// Exactly the announced length: io.ReadAll's doubling would hold
		// up to twice the bytes the budget counts.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(src, body)
	} else {
		body, err = io.ReadAll(&budgetReader{r: src, b: h.bodies, held: &x.bodyHeld})
	}
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
		case errors.Is(err, errBodyBudget):
			return nil, protocol.BodiesInFlight(bodiesRetryAfter)
		}
		return nil, protocol.BadRequest("The request body could not be read.")
	}
	if deadlineSet {
		// The stream that follows may last far longer than the body took.
		_ = rc.SetReadDeadline(time.Time{})
	}
	return body, nil
}

// discardBody reads a refused body of announced length to its end, into
// no memory, under the body read deadline, before the refusal is written.
// Unread, net/http drains at most 256 KiB of it and then closes the
// connection with the rest unread, which the kernel answers with a reset:
// a client still sending a large body (an image) may then see "connection
// reset" instead of the 503 and its Retry-After. Read to its end, the
// refusal is answered on a connection kept alive for the retry. A body
// that does not come in time closes the connection after the answer.
func (h *Handler) discardBody(w http.ResponseWriter, r *http.Request, rc *http.ResponseController) {
	deadlineSet := rc.SetReadDeadline(time.Now().Add(h.cfg.BodyReadTimeout)) == nil
	if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes)); err != nil {
		w.Header().Set("Connection", "close")
		return
	}
	if deadlineSet {
		_ = rc.SetReadDeadline(time.Time{})
	}
}
