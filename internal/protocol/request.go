package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxMessagesHardLimit bounds messages in a decoded job whatever the api's
// configured MAX_MESSAGES; the api enforced its own limit before enqueueing.
const maxMessagesHardLimit = 100000

// Limits are the configurable bounds DecodeChatRequest enforces.
type Limits struct {
	MaxMessages int // MAX_MESSAGES, default 1000
	MaxTokens   int // MAX_TOKENS_LIMIT, default 32768
}

// DefaultLimits are the limits docs/OPERATIONS.md gives as defaults.
var DefaultLimits = Limits{MaxMessages: 1000, MaxTokens: 32768}

// ErrInvalidRequest is wrapped by every validation error of DecodeChatRequest;
// its message is safe to show to the client.
var ErrInvalidRequest = errors.New("invalid request")

type rawRequest struct {
	Messages    *[]rawMessage    `json:"messages"`
	Prompt      *string          `json:"prompt"`
	Model       *string          `json:"model"`
	MaxTokens   *json.RawMessage `json:"max_tokens"`
	Temperature *float64         `json:"temperature"`
	ThreadID    *string          `json:"thread_id"`
	Stream      *bool            `json:"stream"`
}

type rawMessage struct {
	Role    *string `json:"role"`
	Content *string `json:"content"`
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// DecodeChatRequest parses and validates a POST /v1/stream body. Every error
// wraps ErrInvalidRequest and its text is written for the client. It never
// panics.
func DecodeChatRequest(body []byte, lim Limits) (ChatRequest, error) {
	if !utf8.Valid(body) {
		return ChatRequest{}, invalid("body is not valid UTF-8")
	}
	if hasNUL(body) {
		return ChatRequest{}, invalid("body contains a NUL character")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return ChatRequest{}, invalid("body must be a JSON object")
	}
	var raw rawRequest
	if err := strictUnmarshal(body, &raw); err != nil {
		return ChatRequest{}, invalid("malformed JSON: %s", JSONErrorText(err))
	}
	var req ChatRequest
	switch {
	case raw.Messages != nil && raw.Prompt != nil:
		return ChatRequest{}, invalid("give either messages or prompt, not both")
	case raw.Prompt != nil:
		if *raw.Prompt == "" {
			return ChatRequest{}, invalid("prompt must be a non-empty string")
		}
		req.Messages = []Message{{Role: "user", Content: *raw.Prompt}}
	case raw.Messages != nil:
		req.Messages = make([]Message, 0, len(*raw.Messages))
		for i, m := range *raw.Messages {
			if m.Role == nil || m.Content == nil {
				return ChatRequest{}, invalid("messages[%d] needs role and content", i)
			}
			req.Messages = append(req.Messages, Message{Role: *m.Role, Content: *m.Content})
		}
	default:
		return ChatRequest{}, invalid("messages is required")
	}
	if err := validateMessages(req.Messages, lim.MaxMessages); err != nil {
		return ChatRequest{}, err
	}
	if raw.Model != nil {
		if len(*raw.Model) > 256 {
			return ChatRequest{}, invalid("model is longer than 256 characters")
		}
		req.Model = *raw.Model
	}
	if raw.MaxTokens != nil {
		var n int64
		if err := json.Unmarshal(*raw.MaxTokens, &n); err != nil {
			return ChatRequest{}, invalid("max_tokens must be an integer")
		}
		if n < 1 || n > int64(lim.MaxTokens) {
			return ChatRequest{}, invalid("max_tokens must be between 1 and %d", lim.MaxTokens)
		}
		req.MaxTokens = int(n)
	}
	if raw.Temperature != nil {
		if *raw.Temperature < 0 || *raw.Temperature > 2 {
			return ChatRequest{}, invalid("temperature must be between 0 and 2")
		}
		t := *raw.Temperature
		req.Temperature = &t
	}
	if raw.ThreadID != nil {
		if len(*raw.ThreadID) > 128 {
			return ChatRequest{}, invalid("thread_id is longer than 128 characters")
		}
		req.ThreadID = *raw.ThreadID
	}
	return req, nil
}

// hasNUL reports whether body holds a NUL byte or a JSON \u0000 escape. A
// backslash always starts a two-byte escape in valid JSON, so an escaped
// backslash followed by "u0000" is the text \u0000, not a NUL.
func hasNUL(body []byte) bool {
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case 0:
			return true
		case '\\':
			if bytes.HasPrefix(body[i+1:], []byte("u0000")) {
				return true
			}
			i++ // skip the escaped byte
		}
	}
	return false
}

func validateMessages(msgs []Message, max int) error {
	if len(msgs) == 0 {
		return invalid("messages must not be empty")
	}
	if len(msgs) > max {
		return invalid("at most %d messages are allowed", max)
	}
	for i, m := range msgs {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			return invalid("messages[%d].role must be system, user, assistant or tool", i)
		}
		if m.Content == "" {
			return invalid("messages[%d].content must be a non-empty string", i)
		}
		if strings.IndexByte(m.Content, 0) >= 0 {
			return invalid("messages[%d].content contains a NUL character", i)
		}
	}
	return nil
}

// JSONErrorText describes a JSON decoding error without echoing the
// input, for a client-facing 400 (the OpenAI dialect uses it too).
func JSONErrorText(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("field %s has the wrong type", te.Field)
		}
		return "a value has the wrong type"
	}
	return "unexpected end of input"
}
