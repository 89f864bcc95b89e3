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
}

// opener returns the writer of one request's answer.
type opener func(w http.ResponseWriter, writeTimeout time.Duration) eventWriter

// eventWriter is where a session writes one answer. It is owned by the
// handler goroutine, like Writer, which is /v1/stream's.
type eventWriter interface {
	// Start opens the answer on path, with the request id.
	Start(requestID, path string) error
	// Chunk writes the chunk numbered seq within the current attempt.
	Chunk(seq int, content string) error
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

var _ eventWriter = (*Writer)(nil)

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

func openNative(w http.ResponseWriter, writeTimeout time.Duration) eventWriter {
	return NewWriter(w, writeTimeout)
}

// errAnswerEnded is returned by an eventWriter that ended the answer with
// an error of its own, after writing it: a dialect that cannot show a
// restart (a reset after chunks were sent) stops the answer rather than
// mix two. The stream's outcome is then error, and its source is
// cancelled.
var errAnswerEnded = errors.New("stream: the answer was ended by its writer")
