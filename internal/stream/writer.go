// Package stream owns the client side of a stream: the SSE writer
// (headers, events, flushes, heartbeats, disconnects) and the request
// handler that parses a request and picks the direct or queued path
// (docs/API.md for what clients see).
package stream

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Writer writes SSE events to one response. It is owned by the handler
// goroutine and is not safe for concurrent use: producers hand frames to
// that goroutine over a bounded channel instead.
//
// Every event is written and flushed at once, under a write deadline, so a
// client that stops reading is cut off after writeTimeout instead of
// holding memory or a goroutine forever.
type Writer struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// errFlusher is the innermost writer that reports flush errors, when
	// a wrapper in front of it would drop them (see flush).
	errFlusher   interface{ FlushError() error }
	writeTimeout time.Duration
	buf          []byte
	terminal     bool
	flushes      int
}

// ErrTerminated is returned for writes after the terminal event.
var ErrTerminated = errors.New("stream: terminal event already written")

// NewWriter returns a writer for w. writeTimeout bounds each write; zero
// means no deadline.
func NewWriter(w http.ResponseWriter, writeTimeout time.Duration) *Writer {
	return &Writer{w: w, rc: http.NewResponseController(w), errFlusher: innerErrFlusher(w),
		writeTimeout: writeTimeout, buf: make([]byte, 0, 512)}
}

// innerErrFlusher finds, down w's Unwrap chain, the writer whose
// FlushError reports a failed flush, when some wrapper in front of it only
// implements http.Flusher: ResponseController.Flush stops at that wrapper
// (gin's writer is one), whose Flush drops the error. nil when w itself
// reports flush errors, or nothing does.
func innerErrFlusher(w http.ResponseWriter) interface{ FlushError() error } {
	hidden := false
	for {
		if ef, ok := w.(interface{ FlushError() error }); ok {
			if hidden {
				return ef
			}
			return nil
		}
		if _, ok := w.(http.Flusher); ok {
			hidden = true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return nil
		}
		w = u.Unwrap()
	}
}

// Start writes the 200 status and the SSE headers, with the request id and
// the path taken, and flushes them so the client sees the stream open.
func (sw *Writer) Start(requestID, path string) error {
	h := sw.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	setRequestID(h, requestID)
	if path != "" { // a resumed stream does not restate its path
		h.Set("X-Stream-Path", path)
	}
	sw.w.WriteHeader(http.StatusOK)
	return sw.flush()
}

// RequestIDHeader is the response header carrying the request id, spelled
// as docs/API.md spells it. Go would send the canonical "X-Request-Id";
// header names are case-insensitive, but people grep for the documented
// spelling.
const RequestIDHeader = "X-Request-ID"

// setRequestID sets the request id header with its documented spelling.
func setRequestID(h http.Header, id string) {
	delete(h, http.CanonicalHeaderKey(RequestIDHeader))
	h[RequestIDHeader] = []string{id}
}

// Event writes e as an SSE event with its id; a done or error event is
// the terminal one.
func (sw *Writer) Event(e Event) error {
	return sw.write(protocol.AppendIDEvent(sw.buf[:0], e.ID, e.Name, e.Data), e.Terminal())
}

// Ping writes the `: ping` heartbeat comment.
func (sw *Writer) Ping() error {
	return sw.write(append(sw.buf[:0], protocol.PingFrame...), false)
}

// Terminated reports whether a done or error event was written.
func (sw *Writer) Terminated() bool { return sw.terminal }

// Flushes returns how many flushes the writer made, for tests.
func (sw *Writer) Flushes() int { return sw.flushes }

func (sw *Writer) write(b []byte, terminal bool) error {
	if sw.terminal {
		return ErrTerminated
	}
	if sw.writeTimeout > 0 {
		// Not every ResponseWriter supports deadlines (httptest's does
		// not); the stream still works, only without the slow-client cut.
		_ = sw.rc.SetWriteDeadline(time.Now().Add(sw.writeTimeout))
	}
	if _, err := sw.w.Write(b); err != nil {
		return fmt.Errorf("stream: write: %w", err)
	}
	sw.buf = b[:0]
	if terminal {
		sw.terminal = true
	}
	return sw.flush()
}

func (sw *Writer) flush() error {
	sw.flushes++
	if err := sw.rc.Flush(); err != nil {
		return fmt.Errorf("stream: flush: %w", err)
	}
	// Flushed through the wrappers, whatever they keep; the connection's
	// writer then has nothing left to send and reports the error of the
	// flush a wrapper dropped (a write deadline that passed): without it a
	// stalled reader would look like one that took the event.
	if sw.errFlusher != nil {
		if err := sw.errFlusher.FlushError(); err != nil {
			return fmt.Errorf("stream: flush: %w", err)
		}
	}
	return nil
}
