// Package openaiwire owns the OpenAI-compatible wire formats of
// POST /v1/chat/completions and GET /v1/models: the request body, the
// chat.completion and chat.completion.chunk objects, and the error shape
// every problem maps to (docs/API.md, "OpenAI-compatible API"). Like
// internal/protocol it is pure: no I/O, no clocks.
package openaiwire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Request is a validated chat completion request.
type Request struct {
	// Chat is the request as /v1/stream would have it: the same messages,
	// model, max_tokens and temperature, validated by the same rules.
	Chat protocol.ChatRequest
	// Stream asks for chat.completion.chunk events instead of one object.
	Stream bool
	// IncludeUsage asks for a last chunk carrying the usage
	// (stream_options.include_usage).
	IncludeUsage bool
}

// rawRequest holds the fields read. Every other field of OpenAI's request
// (tools, response_format, seed, user, …) is ignored, as are unknown ones:
// clients send many of them by default.
type rawRequest struct {
	Model               *string          `json:"model"`
	Messages            *[]rawMessage    `json:"messages"`
	Stream              *bool            `json:"stream"`
	StreamOptions       *rawStreamOpts   `json:"stream_options"`
	MaxTokens           *json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens *json.RawMessage `json:"max_completion_tokens"`
	Temperature         *float64         `json:"temperature"`
	N                   *json.RawMessage `json:"n"`
}

type rawStreamOpts struct {
	IncludeUsage *bool `json:"include_usage"`
}

type rawMessage struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

type rawPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// nativeRequest is the /v1/stream body a Request is checked as.
type nativeRequest struct {
	Messages    []protocol.Message `json:"messages"`
	Model       *string            `json:"model,omitempty"`
	MaxTokens   json.RawMessage    `json:"max_tokens,omitempty"`
	Temperature *float64           `json:"temperature,omitempty"`
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", protocol.ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// DecodeRequest parses and validates a POST /v1/chat/completions body.
// The request is translated to the /v1/stream body and checked by
// protocol.DecodeChatRequest, so both endpoints apply one set of rules and
// limits. Every error wraps protocol.ErrInvalidRequest and its text is
// written for the client. It never panics.
func DecodeRequest(body []byte, lim protocol.Limits) (Request, error) {
	// encoding/json would quietly replace invalid UTF-8; refuse it as
	// /v1/stream does.
	if !utf8.Valid(body) {
		return Request{}, invalid("body is not valid UTF-8")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Request{}, invalid("body must be a JSON object")
	}
	var raw rawRequest
	if err := json.Unmarshal(body, &raw); err != nil {
		return Request{}, invalid("malformed JSON: %s", protocol.JSONErrorText(err))
	}
	if raw.Messages == nil {
		return Request{}, invalid("messages is required")
	}
	if raw.N != nil && string(*raw.N) != "null" && string(*raw.N) != "1" {
		return Request{}, invalid("n must be 1: one answer per request")
	}
	native := nativeRequest{Model: raw.Model, Temperature: raw.Temperature}
	native.Messages = make([]protocol.Message, 0, min(len(*raw.Messages), lim.MaxMessages+1))
	for i, m := range *raw.Messages {
		if len(native.Messages) > lim.MaxMessages {
			break // DecodeChatRequest refuses the count
		}
		msg, err := decodeMessage(i, m)
		if err != nil {
			return Request{}, err
		}
		native.Messages = append(native.Messages, msg)
	}
	// max_completion_tokens replaced max_tokens in OpenAI's API; when both
	// are given the newer one wins.
	switch {
	case raw.MaxCompletionTokens != nil && string(*raw.MaxCompletionTokens) != "null":
		native.MaxTokens = *raw.MaxCompletionTokens
	case raw.MaxTokens != nil && string(*raw.MaxTokens) != "null":
		native.MaxTokens = *raw.MaxTokens
	}
	b, err := json.Marshal(native)
	if err != nil {
		return Request{}, invalid("the request could not be read")
	}
	chat, err := protocol.DecodeChatRequest(b, lim)
	if err != nil {
		return Request{}, err
	}
	req := Request{Chat: chat}
	if raw.Stream != nil {
		req.Stream = *raw.Stream
	}
	if raw.StreamOptions != nil && raw.StreamOptions.IncludeUsage != nil {
		req.IncludeUsage = *raw.StreamOptions.IncludeUsage
	}
	return req, nil
}

// decodeMessage reads one message: its content is a string or an array of
// text parts, joined with a line break (as vLLM does).
func decodeMessage(i int, m rawMessage) (protocol.Message, error) {
	if m.Role == nil {
		return protocol.Message{}, invalid("messages[%d] needs role and content", i)
	}
	role := *m.Role
	// OpenAI's newer name for the system role.
	if role == "developer" {
		role = "system"
	}
	content := bytes.TrimSpace(m.Content)
	switch {
	case len(content) == 0 || string(content) == "null":
		return protocol.Message{}, invalid("messages[%d] needs role and content", i)
	case content[0] == '"':
		var s string
		if err := json.Unmarshal(content, &s); err != nil {
			return protocol.Message{}, invalid("messages[%d].content must be a string or an array of text parts", i)
		}
		return protocol.Message{Role: role, Content: s}, nil
	case content[0] == '[':
		var parts []rawPart
		if err := json.Unmarshal(content, &parts); err != nil {
			return protocol.Message{}, invalid("messages[%d].content must be a string or an array of text parts", i)
		}
		texts := make([]string, 0, len(parts))
		for j, p := range parts {
			if p.Type != "text" || p.Text == nil {
				return protocol.Message{}, invalid("messages[%d].content[%d] must be a text part: only text is supported", i, j)
			}
			texts = append(texts, *p.Text)
		}
		return protocol.Message{Role: role, Content: strings.Join(texts, "\n")}, nil
	}
	return protocol.Message{}, invalid("messages[%d].content must be a string or an array of text parts", i)
}
