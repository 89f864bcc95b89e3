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
	// request and the sink its answer is written to; its error text is
	// written for the client.
	decode(body []byte, lim protocol.Limits) (protocol.ChatRequest, opener, error)
	// refuse answers p before any answer started.
	refuse(w http.ResponseWriter, p *protocol.Problem, instance string)
	// resumable reports whether the dialect's streams are logged and may
	// outlive their client for a resume (GET /v1/streams/{id}).
	resumable() bool
}

// opener returns the sink of one request's answer.
type opener func(w http.ResponseWriter, writeTimeout time.Duration) sink

// native is /v1/stream's dialect: docs/API.md's body, SSE events and
// problem documents.
type native struct{}

func (native) decode(body []byte, lim protocol.Limits) (protocol.ChatRequest, opener, error) {
	req, err := protocol.DecodeChatRequest(body, lim)
	if req.N > 1 {
		return req, openNativeChoices, err
	}
	return req, openNative, err
}

func (native) refuse(w http.ResponseWriter, p *protocol.Problem, instance string) {
	WriteProblem(w, p, instance)
}

func (native) resumable() bool { return true }

// openNative opens /v1/stream's sink; openNativeChoices that of a
// request for several choices, whose every chunk event says its choice.
func openNative(w http.ResponseWriter, writeTimeout time.Duration) sink {
	return &nativeSink{sw: newWriter(w, writeTimeout)}
}

func openNativeChoices(w http.ResponseWriter, writeTimeout time.Duration) sink {
	return &nativeChoices{nativeSink{sw: newWriter(w, writeTimeout)}}
}

// errAnswerEnded is returned by a sink that ended the answer with
// an error of its own, after writing it: a dialect that cannot show a
// restart (a reset after chunks were sent) stops the answer rather than
// mix two. The stream's outcome is then error, and its source is
// cancelled.
var errAnswerEnded = errors.New("stream: the answer was ended by its writer")
