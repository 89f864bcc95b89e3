package stream

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/internal/connwatch"
)

// A queued stream may wait minutes before its first chunk. While a
// handler runs, net/http keeps a second goroutine per connection blocked
// in a read, only to notice a client that leaves, plus its buffers. The
// Writer of a stream that has waited a while (Config.TakeOverAfter)
// therefore takes the connection over from net/http (http.Hijacker): it
// goes on with the chunked body itself, and connwatch tells when the
// client hangs up, with no goroutine of its own on Linux. Then the stream
// parks (Handler.park): its loop goes on in a goroutine of its own with
// a small stack, and the handler returns, giving back net/http's and
// gin's state of the request (docs/bench-history/2026-11.md, "Waiting streams").
//
// The connection is closed when the stream ends: a client's next request
// opens a new connection, which costs little next to a stream that waited
// in the queue. A stream that gets its worker before TakeOverAfter keeps
// net/http, and its keep-alive connection. A writer that takes over
// before the head (TakeOverAfter negative, or an OpenAI answer that has
// sent nothing yet) writes the head itself, with "Connection: close".

// chunkRoom is the room at the start of a taken-over writer's buffer for
// a chunk's size line: up to 16 hex digits and CRLF.
const chunkRoom = 18

// minBufio is the smallest buffer bufio.NewReaderSize gives.
const minBufio = 16

// lastChunk ends a chunked body (RFC 9112, section 7.1).
const lastChunk = "0\r\n\r\n"

// takeOver takes r's connection over from net/http, before anything was
// written or between events: net/http has then sent the head with a
// chunked body (HTTP/1.1, no Content-Length), which the writer goes on
// with. It returns a channel closed when the client hangs up, which
// stands in for the request context's Done from then on; false when the
// connection cannot be taken (HTTP/2, HTTP/1.0, a ResponseWriter without
// Hijack, events gathered and not written): the stream then goes on
// through net/http.
func (sw *Writer) takeOver(r *http.Request) (gone <-chan struct{}, ok bool) {
	if sw.conn != nil {
		return sw.watch.Gone(), true
	}
	if r.ProtoMajor != 1 || r.ProtoMinor < 1 || len(sw.buf) > 0 || sw.holding || sw.headerPending || sw.terminal {
		return nil, false
	}
	if sw.started {
		// Every event is flushed as it is written; this only makes sure
		// nothing is left in net/http's response buffer, which Hijack
		// drops.
		if err := sw.rc.Flush(); err != nil {
			return nil, false
		}
	}
	conn, brw, err := sw.rc.Hijack()
	if err != nil {
		return nil, false
	}
	// The reader and writer net/http hands over are its connection's own,
	// 4 KiB each, and stay referenced by it until the handler returns.
	// Nothing reads or writes through them any more (a client of an SSE
	// stream sends nothing after its request, and the writer writes to
	// conn), so each gets a minimal buffer in place, and the 8 KiB go
	// back to the heap while the stream waits.
	*brw.Reader = *bufio.NewReaderSize(nil, minBufio)
	*brw.Writer = *bufio.NewWriterSize(nil, minBufio)
	// The map is net/http's response's own, which nothing else writes once
	// the connection is ours; the ResponseWriter in front of it may serve
	// another request once the handler returned (Handler.park).
	sw.hdr = sw.w.Header()
	sw.conn, sw.watch = conn, connwatch.Start(conn)
	sw.deadline = time.Time{} // whatever Hijack left, the next write sets its own
	sw.base = chunkRoom
	sw.buf = make([]byte, chunkRoom, chunkRoom+256)
	sw.errFlusher = nil
	return sw.watch.Gone(), true
}

// finish closes a taken-over connection; the client then has the whole
// body (the last chunk went out with the terminal event) or sees it cut.
func (sw *Writer) finish() {
	if sw.conn == nil {
		return
	}
	sw.watch.Stop()
	_ = sw.conn.Close()
}

// respond writes a whole response with status and body instead of a
// stream, on a taken-over connection before anything was written: an
// OpenAI answer that fails before its first byte is an HTTP error.
func (sw *Writer) respond(status int, body []byte) error {
	if sw.terminal || sw.head != nil || sw.started {
		return ErrTerminated
	}
	sw.terminal = true
	h := sw.header()
	h.Set("Content-Length", strconv.Itoa(len(body)))
	frame := append(appendHead(nil, status, h), body...)
	sw.armDeadline(sw.conn.SetWriteDeadline)
	if _, err := sw.conn.Write(frame); err != nil {
		return fmt.Errorf("stream: write: %w", err)
	}
	return nil
}

// appendHead appends the status line and h, for a taken-over connection.
// A response without a Content-Length has a chunked body.
func appendHead(dst []byte, status int, h http.Header) []byte {
	h.Set("Connection", "close")
	if h.Get("Content-Length") == "" {
		h.Set("Transfer-Encoding", "chunked")
	}
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	dst = append(dst, "HTTP/1.1 "...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, ' ')
	dst = append(dst, http.StatusText(status)...)
	b := bytes.NewBuffer(append(dst, "\r\n"...))
	// Header.Write replaces CR and LF in values with spaces: nothing set
	// by a middleware can split the response.
	_ = h.Write(b)
	b.WriteString("\r\n")
	return b.Bytes()
}

// outConn writes what is gathered as one chunk of the body, after the
// head when it is still to go, in one write under the write deadline.
func (sw *Writer) outConn() error {
	n := len(sw.buf) - sw.base
	var frame []byte
	if n > 0 {
		var size [chunkRoom]byte
		line := append(strconv.AppendUint(size[:0], uint64(n), 16), "\r\n"...)
		start := sw.base - len(line)
		copy(sw.buf[start:], line)
		sw.buf = append(sw.buf, "\r\n"...)
		if sw.terminal {
			sw.buf = append(sw.buf, lastChunk...)
		}
		frame = sw.buf[start:]
	}
	if sw.head != nil {
		// Once a stream: the head and the first events in one write.
		frame = append(sw.head, frame...)
		sw.head = nil
		sw.headerPending = false
	}
	if len(frame) == 0 {
		return nil
	}
	sw.armDeadline(sw.conn.SetWriteDeadline)
	_, err := sw.conn.Write(frame)
	sw.written(sw.base)
	sw.flushes++
	if err != nil {
		return fmt.Errorf("stream: write: %w", err)
	}
	return nil
}
