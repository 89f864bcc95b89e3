// Package stream owns the client side of a stream: the SSE writer
// (headers, events, flushes, heartbeats, disconnects) and the request
// handler that parses a request and picks the direct or queued path
// (docs/API.md for what clients see).
package stream

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/connwatch"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Writer writes SSE events to one response. It is owned by the goroutine
// that runs the stream's loop (the handler's, or the stream's own once it
// parked, Handler.park) and is not safe for concurrent use: producers hand
// frames to that goroutine over a bounded channel instead.
//
// Every event is written and flushed at once, under a write deadline, so a
// client that stops reading is cut off after writeTimeout instead of
// holding memory or a goroutine forever. Between Hold and Flush, events
// are gathered and go out in one write and one flush: what is ready at
// the same moment costs one system call, not one per chunk
// (docs/bench-history/2026-11.md, "Per chunk: no allocation, no full decode").
type Writer struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// errFlusher is the innermost writer that reports flush errors, when
	// a wrapper in front of it would drop them (see flush).
	errFlusher   interface{ FlushError() error }
	writeTimeout time.Duration
	// deadline is the write deadline last set on the connection
	// (armDeadline); zero when none was.
	deadline time.Time
	buf      []byte // what is gathered and not yet written
	// big, while a gather outgrows the stream's own buffer (own), is the
	// pooled buffer buf is then in, given back once written (chunkRoom).
	big     *[]byte
	own     []byte
	holding bool
	// headerPending: Start ran under Hold or lazily (startLazy), so the
	// status and headers wait to go out with the first events, in one
	// write.
	headerPending bool
	// startLazy makes Start keep the status and headers for the first
	// event, or for FlushHeader, rather than flush them at once.
	startLazy bool
	terminal  bool
	flushes   int

	// conn is the connection once the writer took it over from net/http
	// (takeOver): the writer then frames the response itself, and base
	// bytes at the start of buf are room for a chunk's size line.
	conn  net.Conn
	watch *connwatch.Watch
	head  []byte // the status line and headers, until they are written
	base  int
	// started: Start wrote the status and headers through net/http.
	started bool
	// hdr is the response's header map, kept at takeOver: the
	// ResponseWriter is dropped when the stream parks.
	hdr http.Header
}

// header is the response's header map.
func (sw *Writer) header() http.Header {
	if sw.hdr != nil {
		return sw.hdr
	}
	return sw.w.Header()
}

// ErrTerminated is returned for writes after the terminal event.
var ErrTerminated = errors.New("stream: terminal event already written")

// NewWriter returns a writer for w. writeTimeout bounds each write; zero
// means no deadline.
func NewWriter(w http.ResponseWriter, writeTimeout time.Duration) *Writer {
	sw := newWriter(w, writeTimeout)
	return &sw
}

// newWriter is NewWriter's Writer, for a sink that holds its writer in
// itself: one allocation a stream fewer.
func newWriter(w http.ResponseWriter, writeTimeout time.Duration) Writer {
	return Writer{w: w, rc: http.NewResponseController(w), errFlusher: innerErrFlusher(w),
		writeTimeout: writeTimeout}
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
// the path taken, and flushes them so the client sees the stream open;
// under Hold, they go out with the events gathered, at Flush; after
// StartLazy, with the first event written or at FlushHeader.
func (sw *Writer) Start(requestID, path string) error {
	h := sw.header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	setRequestID(h, requestID)
	if path != "" { // a resumed stream does not restate its path
		h.Set("X-Stream-Path", path)
	}
	if sw.conn != nil {
		sw.head = appendHead(nil, http.StatusOK, h)
	} else {
		sw.started = true
		sw.w.WriteHeader(http.StatusOK)
	}
	if sw.holding || sw.startLazy {
		sw.headerPending = true
		return nil
	}
	if sw.conn != nil {
		return sw.outConn()
	}
	return sw.flush()
}

// StartLazy makes the next Start keep the status and headers until the
// first event goes out, which carries them in its write, or until
// FlushHeader: a direct answer whose first chunk comes at once costs one
// write and one wake-up of the client less (docs/API.md, "Success
// response").
func (sw *Writer) StartLazy() { sw.startLazy = true }

// HeaderPending reports that Start's status and headers have not gone
// out yet and no Hold keeps them.
func (sw *Writer) HeaderPending() bool { return sw.headerPending && !sw.holding }

// FlushHeader sends the status and headers Start kept, if they have not
// gone out yet.
func (sw *Writer) FlushHeader() error {
	if !sw.headerPending || sw.holding {
		return nil
	}
	return sw.out()
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
// the terminal one. A chunk without Data is encoded from its Content
// straight into the write buffer.
func (sw *Writer) Event(e Event) error {
	if sw.terminal {
		return ErrTerminated
	}
	if e.Name == "" {
		sw.chunkRoom(len(e.Data) + 2*len(e.Content) + 64)
	}
	if e.Data == nil && e.Name == "" {
		sw.buf = appendChunkEvent(sw.buf, e.ID, e.Content)
	} else {
		sw.buf = protocol.AppendIDEvent(sw.buf, e.ID, e.Name, e.Data)
	}
	return sw.commit(e.Terminal())
}

// eventBuf is the write buffer a stream gets at its first chunk: room
// for a few dozen chunks gathered into one write.
const eventBuf = 2 << 10

// chunkRoom makes room in the buffer for a chunk event of about n bytes.
// The stream's own buffer is sized for chunks at the first: at the first
// chunk, not at the first ping or queue position, so a stream that only
// waits keeps a few bytes. A gather of chunks that outgrows it (a fast
// upstream's, Hold) moves to a buffer of bigBufs until it is written,
// instead of growing the stream's step by step, an allocation and a copy
// each, and keeping it (docs/bench-history/2026-11.md, "The OpenAI
// relay's CPU").
func (sw *Writer) chunkRoom(n int) {
	if cap(sw.buf) < eventBuf {
		sw.buf = slices.Grow(sw.buf, eventBuf)
	}
	if cap(sw.buf)-len(sw.buf) >= n || sw.big != nil || len(sw.buf)+n > bigBuf {
		return // room enough, or a gather already in a big buffer (append grows it)
	}
	bp := bigBufs.Get().(*[]byte)
	sw.own, sw.big = sw.buf, bp
	sw.buf = append((*bp)[:0], sw.buf...)
}

// written empties the buffer once its bytes were written (keep bytes of
// room at its start), and gives a big buffer back: neither the
// ResponseWriter nor the connection keeps what it was given.
func (sw *Writer) written(keep int) {
	if sw.big == nil {
		sw.buf = sw.buf[:keep]
		return
	}
	if cap(sw.buf) <= maxBigBuf {
		*sw.big = sw.buf[:0]
		bigBufs.Put(sw.big)
	}
	sw.buf, sw.own, sw.big = sw.own[:keep], nil, nil
}

// bigBufs are the buffers of gathers that outgrow a stream's own
// (chunkRoom): room for a few dozen chunks; one that grew past maxBigBuf
// is not kept.
var bigBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, bigBuf)
	return &b
}}

const (
	bigBuf    = 16 << 10
	maxBigBuf = 64 << 10
)

// appendChunkEvent appends a chunk event with its data encoded from
// content, as Event.encoded would encode it.
func appendChunkEvent(dst []byte, id int64, content string) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendInt(dst, id, 10)
	dst = append(dst, "\ndata: "...)
	dst = appendChunkData(dst, content)
	return append(dst, "\n\n"...)
}

// appendChunkData appends a chunk's data, {"content":…}.
func appendChunkData(dst []byte, content string) []byte {
	dst = append(dst, `{"content":`...)
	dst = protocol.AppendJSONString(dst, content)
	return append(dst, '}')
}

// Ping writes the `: ping` heartbeat comment.
func (sw *Writer) Ping() error {
	return sw.write(protocol.PingFrame, false)
}

// Hold gathers the events written from now on until Flush, which writes
// them in one write and one flush. A terminal event is written at once
// with what was gathered.
func (sw *Writer) Hold() { sw.holding = true }

// Flush writes and flushes what was gathered since Hold, and ends the
// hold.
func (sw *Writer) Flush() error {
	sw.holding = false
	return sw.out()
}

// Terminated reports whether a done or error event was written.
func (sw *Writer) Terminated() bool { return sw.terminal }

// Flushes returns how many flushes the writer made, for tests.
func (sw *Writer) Flushes() int { return sw.flushes }

// write writes the wire bytes b, as one event.
func (sw *Writer) write(b []byte, terminal bool) error {
	if sw.terminal {
		return ErrTerminated
	}
	sw.buf = append(sw.buf, b...)
	return sw.commit(terminal)
}

// commit sends what is gathered unless the writer holds it.
func (sw *Writer) commit(terminal bool) error {
	if terminal {
		sw.terminal = true
	} else if sw.holding {
		return nil
	}
	return sw.out()
}

func (sw *Writer) out() error {
	if sw.conn != nil {
		return sw.outConn()
	}
	if len(sw.buf) == 0 {
		if sw.headerPending {
			sw.headerPending = false
			return sw.flush()
		}
		return nil
	}
	sw.headerPending = false
	// Not every ResponseWriter supports deadlines (httptest's does not);
	// the stream still works, only without the slow-client cut.
	sw.armDeadline(sw.rc.SetWriteDeadline)
	_, err := sw.w.Write(sw.buf)
	sw.written(0)
	if err != nil {
		return fmt.Errorf("stream: write: %w", err)
	}
	return sw.flush()
}

// deadlineSlack is how far beyond writeTimeout armDeadline sets the
// deadline, as a fraction of writeTimeout (1/deadlineSlack).
const deadlineSlack = 4

// armDeadline makes sure the write about to start has at least
// writeTimeout before the connection's deadline, through set. Moving a
// deadline is a runtime timer update, once per write and so per chunk of
// a paced answer; armDeadline moves it only when less than writeTimeout
// is left, to writeTimeout plus a quarter from now: at most once per
// quarter writeTimeout however many writes, and a client that takes
// nothing is cut between writeTimeout and 1.25 writeTimeout after the
// write began (docs/OPERATIONS.md, "Fixed in the code today").
func (sw *Writer) armDeadline(set func(time.Time) error) {
	if sw.writeTimeout <= 0 {
		return
	}
	now := time.Now()
	if sw.deadline.Sub(now) >= sw.writeTimeout {
		return
	}
	d := now.Add(sw.writeTimeout + sw.writeTimeout/deadlineSlack)
	if set(d) == nil {
		sw.deadline = d
	}
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
