package stream

import (
	"errors"
	"net/http"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// dialect is what differs between the endpoints the handler serves: how a
// request body is read and how refusals and answers are written. Identity,
// admission, the pool, the path choice, the queue and overload are the
// same for every dialect (docs/API.md, "OpenAI-compatible API").
type dialect interface {
	// decode validates a body read within MaxBodyBytes. It returns the
	// request and how its answer is written; its error text is written for
	// the client.
	decode(body []byte, lim protocol.Limits) (protocol.ChatRequest, opener, error)
	// refuse answers p before any answer started.
	refuse(w http.ResponseWriter, p *protocol.Problem, instance string)
	// resumable reports whether the dialect's streams are logged and may
	// outlive their client for a resume (GET /v1/streams/{id}).
	resumable() bool
}

// opener returns the Sink of one request's answer.
type opener func(w http.ResponseWriter, writeTimeout time.Duration) Sink

// eventWriter is a dialect's writer of one answer, by kind of event: what
// a wire format without SSE ids implements; eventSink makes it a Sink.
// It is owned by the goroutine of the stream's loop, like Writer, which is
// /v1/stream's.
type eventWriter interface {
	// Start opens the answer on path, with the request id.
	Start(requestID, path string) error
	// Chunk writes the chunk numbered seq within the current attempt:
	// the upstream's raw chunk when it has one, else plain content.
	Chunk(seq int, content string, raw []byte) error
	// Reset voids the chunks so far: another attempt starts.
	Reset(protocol.Reset) error
	// Retrying says the provider call failed before any chunk and is
	// tried again after a delay.
	Retrying(protocol.Retrying) error
	// Done ends the answer successfully.
	Done(protocol.Done) error
	// Error ends the answer with p.
	Error(*protocol.Problem) error
	// Ping keeps an idle answer alive.
	Ping() error
}

// eventSink is the Sink of an eventWriter: it drops the event ids (the
// session still numbers every event) and the events the dialect has no
// form for.
type eventSink struct{ ew eventWriter }

func (s eventSink) Start(requestID, path string) error { return s.ew.Start(requestID, path) }

func (s eventSink) Ping() error { return s.ew.Ping() }

func (s eventSink) Hold() {
	if h, ok := s.ew.(holder); ok {
		h.Hold()
	}
}

func (s eventSink) Flush() error {
	if h, ok := s.ew.(holder); ok {
		return h.Flush()
	}
	return nil
}

func (s eventSink) Event(e Event) error {
	switch e.Name {
	case "":
		return s.ew.Chunk(int(e.ID), e.Content, e.Raw)
	case protocol.EventReset:
		return s.ew.Reset(*e.Reset)
	case protocol.EventRetrying:
		return s.ew.Retrying(*e.Retrying)
	case protocol.EventDone:
		return s.ew.Done(*e.Done)
	case protocol.EventError:
		return s.ew.Error(e.Problem)
	}
	// A queued position has no form outside /v1/stream.
	return nil
}

// native is /v1/stream's dialect: docs/API.md's body, SSE events and
// problem documents.
type native struct{}

func (native) decode(body []byte, lim protocol.Limits) (protocol.ChatRequest, opener, error) {
	req, err := protocol.DecodeChatRequest(body, lim)
	return req, openNative, err
}

func (native) refuse(w http.ResponseWriter, p *protocol.Problem, instance string) {
	WriteProblem(w, p, instance)
}

func (native) resumable() bool { return true }

func openNative(w http.ResponseWriter, writeTimeout time.Duration) Sink {
	return NewWriter(w, writeTimeout)
}

// errAnswerEnded is returned by an eventWriter that ended the answer with
// an error of its own, after writing it: a dialect that cannot show a
// restart (a reset after chunks were sent) stops the answer rather than
// mix two. The stream's outcome is then error, and its source is
// cancelled.
var errAnswerEnded = errors.New("stream: the answer was ended by its writer")
