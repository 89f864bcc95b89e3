package stream

import (
	"encoding/json"

	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Event is one event of a stream, numbered and encoded once by the
// session: what the client's sink writes and what the stream log keeps.
// Exactly one of the typed fields is set, by Name.
type Event struct {
	// ID is 1, 2, 3, … over the whole stream; a reset and the terminal
	// event take the next id too (docs/API.md).
	ID int64
	// Name is empty for a chunk, else protocol.EventReset, EventQueued,
	// EventRetrying, EventDone or EventError.
	Name string
	// Data is the event's JSON data, on one line.
	Data []byte

	Content string // a chunk's content
	// Raw is a chunk's upstream JSON, for a sink that relays it (the
	// OpenAI dialect); nil for a chunk of plain content.
	Raw      []byte
	Reset    *protocol.Reset
	Queued   *protocol.Queued
	Retrying *protocol.Retrying
	Done     *protocol.Done
	Problem  *protocol.Problem
}

// Terminal reports whether e ends the stream.
func (e Event) Terminal() bool {
	return e.Name == protocol.EventDone || e.Name == protocol.EventError
}

// encoded returns e with Data set from its typed field.
func (e Event) encoded() Event {
	var v any
	switch {
	case e.Name == "":
		e.Data = appendChunkData(nil, e.Content)
		return e
	case e.Reset != nil:
		v = e.Reset
	case e.Queued != nil:
		v = e.Queued
	case e.Retrying != nil:
		v = e.Retrying
	case e.Done != nil:
		v = e.Done
	default:
		v = e.Problem
	}
	// Our own types of strings and numbers: Marshal cannot fail.
	e.Data, _ = json.Marshal(v)
	return e
}

// errorEvent is the terminal error event with id carrying p.
func errorEvent(id int64, p *protocol.Problem) Event {
	return Event{ID: id, Name: protocol.EventError, Problem: p}.encoded()
}

// sink is one dialect's writer of a session's answer: /v1/stream's
// events (nativeSink), OpenAI's chat completion chunks (chatChunks), the
// Responses API's events (responsesEvents), or an answer written in one
// piece (wholeAnswer). The session hands it every frame the same way,
// whichever dialect it writes: it never asks which sink it has. A sink is
// owned by the goroutine of the stream's loop, as Writer is, and is not
// safe for concurrent use. An error means the client is gone or too slow;
// the session stops writing to it.
type sink interface {
	// start opens the response: status and headers, or only the headers
	// when the dialect holds the status back until the answer's first
	// byte (a failure before it is then still an HTTP error).
	start(requestID, path string) error
	// chunk translates one upstream chunk into the dialect's events and
	// hands each to s.emit, which numbers it, logs it when the stream is
	// logged, and gives it back to event while the client is there. It
	// runs with and without a client: a detached stream's log still gets
	// the events. The first failed write is returned.
	chunk(s *session, c protocol.Chunk) error
	// event writes and flushes one event: a chunk event chunk made, or
	// one of the session's own (queued, reset, retrying, done, error).
	// A dialect drops the events it has no form for.
	event(Event) error
	// ping keeps an idle answer alive.
	ping() error
	// gather holds what is written until send, which sends it in one
	// write and one flush (Writer.Hold, Writer.Flush).
	gather()
	send() error
	// sse is the SSE writer under the sink, which may take the
	// connection over from net/http while the stream waits
	// (Writer.takeOver); nil for an answer written in one piece.
	sse() *Writer
}

// nativeSink writes /v1/stream's events (docs/API.md): a chunk's content,
// and the extra deltas of an upstream chunk, one event per choice that
// shows something, with their SSE ids. nativeChoices is the same for a
// request that asked for several choices (n > 1): every chunk event says
// its choice. It is the Writer alone, so a waiting stream holds no more
// than one.
type nativeSink struct{ sw Writer }

type nativeChoices struct{ nativeSink }

func (n *nativeSink) start(requestID, path string) error { return n.sw.Start(requestID, path) }
func (n *nativeSink) event(e Event) error                { return n.sw.Event(e) }
func (n *nativeSink) ping() error                        { return n.sw.Ping() }
func (n *nativeSink) gather()                            { n.sw.Hold() }
func (n *nativeSink) send() error                        { return n.sw.Flush() }
func (n *nativeSink) sse() *Writer                       { return &n.sw }

func (n *nativeSink) chunk(s *session, c protocol.Chunk) error { return nativeChunk(s, c, false) }

func (n *nativeChoices) chunk(s *session, c protocol.Chunk) error { return nativeChunk(s, c, true) }

// nativeChunk emits the /v1/stream events of c; choices says that every
// one names its choice. The data of the events handed to the log is
// carved from the session's slab (chunkData).
func nativeChunk(s *session, c protocol.Chunk, choices bool) error {
	switch {
	case c.Raw != nil:
		return nativeDeltas(s, c.Raw, choices)
	case c.Content == "":
		return nil // nothing a /v1/stream event shows
	case choices:
		// Plain content of the first choice, which says so when the
		// request asked for several.
		return s.emit(Event{Data: s.choiceData(c.Content)})
	case s.logged():
		// The data is encoded for the log; the writer copies it.
		return s.emit(Event{Content: c.Content, Data: s.chunkData(c.Content)})
	}
	// The writer encodes the content straight into its own buffer.
	return s.emit(Event{Content: c.Content})
}

// nativeDeltas emits the events of an upstream chunk with extra deltas:
// one per choice that shows something (docs/API.md, "The native
// /v1/stream dialect"). Their data is carved from the session's slab, as
// chunkData's. The first failed write to the client is returned; the rest
// are still numbered and logged.
func nativeDeltas(s *session, raw []byte, choices bool) error {
	if cap(s.slab)-len(s.slab) < 2*len(raw) {
		s.slab = make([]byte, 0, max(slabBlock, 2*len(raw)))
	}
	var spans [][2]int
	s.slab, spans = openaiwire.AppendNativeEvents(s.slab, raw, choices)
	var err error
	for _, sp := range spans {
		data := s.slab[sp[0]:sp[1]:sp[1]]
		if e := s.emit(Event{Data: data}); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// chunkData returns the data of a chunk of content, carved from the end of
// the session's slab: blocks that are only appended to (never written
// below their length), a new one when the last is full, so bytes handed
// to the log are never overwritten. One allocation per block rather than
// per chunk.
func (s *session) chunkData(content string) []byte {
	size := len(`{"content":""}`) + len(content) // more when escaped: append grows the block
	if cap(s.slab)-len(s.slab) < size {
		s.slab = make([]byte, 0, max(slabBlock, 2*size))
	}
	start := len(s.slab)
	s.slab = appendChunkData(s.slab, content)
	return s.slab[start:len(s.slab):len(s.slab)]
}

// choiceData is chunkData with "choice":0, carved from the slab.
func (s *session) choiceData(content string) []byte {
	d := s.chunkData(content)
	start := len(s.slab)
	s.slab = append(s.slab, d[:len(d)-1]...)
	s.slab = append(s.slab, `,"choice":0}`...)
	return s.slab[start:len(s.slab):len(s.slab)]
}

// slabBlock is the size of one block of a session's chunk data.
const slabBlock = 4 << 10

var (
	_ sink = (*nativeSink)(nil)
	_ sink = (*nativeChoices)(nil)
	_ sink = (*chatChunks)(nil)
	_ sink = (*responsesEvents)(nil)
	_ sink = (*wholeAnswer)(nil)
)
