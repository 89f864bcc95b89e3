// Package openaiwire owns the OpenAI-compatible wire formats of
// POST /v1/chat/completions and GET /v1/models: the request body, the
// chat.completion and chat.completion.chunk objects, and the error shape
// every problem maps to (docs/API.md, "OpenAI-compatible API"). Like
// internal/protocol it is pure: no I/O, no clocks.
package openaiwire

import (
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Request is a validated chat completion request.
type Request struct {
	// Chat is the request, its body kept as sent, validated by the same
	// rules as /v1/stream's.
	Chat protocol.ChatRequest
	// Stream asks for chat.completion.chunk events instead of one object.
	Stream bool
	// IncludeUsage asks for a last chunk carrying the usage
	// (stream_options.include_usage).
	IncludeUsage bool
}

// DecodeRequest parses and validates a POST /v1/chat/completions body by
// docs/API.md's input rules (protocol.DecodeOpenAIChat): the body is kept
// as sent, to be forwarded with only the fields Spillway owns changed.
// Every error wraps protocol.ErrInvalidRequest and its text is written
// for the client. It never panics.
func DecodeRequest(body []byte, lim protocol.Limits) (Request, error) {
	chat, err := protocol.DecodeOpenAIChat(body, lim)
	if err != nil {
		return Request{}, err
	}
	return Request{Chat: chat, Stream: chat.Stream, IncludeUsage: chat.IncludeUsage}, nil
}
