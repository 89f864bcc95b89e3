package stream

import (
	"encoding/json"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Event is one event of a stream, numbered and encoded once by the
// session: what the client's Sink writes and what the stream log keeps.
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

// Sink is where a session writes its client's events: the SSE Writer, or
// another wire format over the same flow (an OpenAI-compatible one). It is
// owned by the goroutine of the stream's loop, as Writer is, and not safe
// for concurrent use. An error means the client is gone or too slow; the
// session stops writing to it.
type Sink interface {
	// Start opens the response: status and headers.
	Start(requestID, path string) error
	// Event writes and flushes one event.
	Event(Event) error
	// Ping writes a heartbeat when nothing else was sent for a while.
	Ping() error
}

// holder is a Sink that can gather events and send them together: the
// session holds while it writes every frame that is ready, then flushes
// once (Writer.Hold).
type holder interface {
	Hold()
	Flush() error
}

var (
	_ Sink   = (*Writer)(nil)
	_ holder = (*Writer)(nil)
	_ holder = eventSink{}
	_ holder = (*openaiChunks)(nil)
)
