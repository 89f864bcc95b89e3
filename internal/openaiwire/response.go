package openaiwire

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Object names of OpenAI's response objects.
const (
	ObjectChunk      = "chat.completion.chunk"
	ObjectCompletion = "chat.completion"
	ObjectList       = "list"
	ObjectModel      = "model"
)

// RoleAssistant is the role of every answer.
const RoleAssistant = "assistant"

// OwnedBy is the owned_by of every model listed.
const OwnedBy = "spillway"

// DoneFrame ends a successful stream, as OpenAI's does.
var DoneFrame = []byte("data: [DONE]\n\n")

// CompletionID is the id of the completion answering request requestID,
// so the id a client logs leads to the api's logs (X-Request-ID).
func CompletionID(requestID string) string { return "chatcmpl-" + requestID }

// ChunkEncoder writes the chat.completion.chunk events of one answer. Its
// fields that do not change between chunks are encoded once.
type ChunkEncoder struct {
	head []byte // `data: {"id":…,"object":…,"created":…,"model":…,`
}

// NewChunkEncoder returns the encoder of the answer to requestID.
func NewChunkEncoder(requestID, model string, created int64) *ChunkEncoder {
	h := []byte(`data: {"id":`)
	h = appendString(h, CompletionID(requestID))
	h = append(h, `,"object":"`+ObjectChunk+`","created":`...)
	h = strconv.AppendInt(h, created, 10)
	h = append(h, `,"model":`...)
	h = appendString(h, model)
	return &ChunkEncoder{head: append(h, ',')}
}

// AppendContent appends a chunk whose delta carries content, and the
// assistant role when withRole (the first chunk of an answer).
func (e *ChunkEncoder) AppendContent(dst []byte, content string, withRole bool) []byte {
	dst = append(dst, e.head...)
	dst = append(dst, `"choices":[{"index":0,"delta":{`...)
	if withRole {
		dst = append(dst, `"role":"`+RoleAssistant+`",`...)
	}
	dst = append(dst, `"content":`...)
	dst = appendString(dst, content)
	return append(dst, "},\"finish_reason\":null}]}\n\n"...)
}

// AppendFinish appends the last chunk of the answer: an empty delta with
// its finish_reason.
func (e *ChunkEncoder) AppendFinish(dst []byte, finishReason string) []byte {
	dst = append(dst, e.head...)
	dst = append(dst, `"choices":[{"index":0,"delta":{},"finish_reason":`...)
	dst = appendString(dst, finishReason)
	return append(dst, "}]}\n\n"...)
}

// AppendUsage appends the usage chunk sent when the request asked for
// stream_options.include_usage: no choices, only the usage.
func (e *ChunkEncoder) AppendUsage(dst []byte, u protocol.Usage) []byte {
	dst = append(dst, e.head...)
	dst = append(dst, `"choices":[],"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(u.PromptTokens), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(u.CompletionTokens), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(u.TotalTokens), 10)
	return append(dst, "}}\n\n"...)
}

// appendString appends s as a JSON string. JSON escapes CR, LF and NUL,
// so content cannot start another SSE line.
func appendString(dst []byte, s string) []byte {
	return protocol.AppendJSONString(dst, s)
}

// Completion is the chat.completion object answering a request made
// without stream.
type Completion struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices []Choice        `json:"choices"`
	Usage   *protocol.Usage `json:"usage,omitempty"`
}

// Choice is the one answer of a Completion.
type Choice struct {
	Index        int     `json:"index"`
	Message      Message `json:"message"`
	FinishReason string  `json:"finish_reason"`
}

// Message is the assistant's message of a Choice.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Error is OpenAI's error object.
type Error struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// ErrorBody is what a refusal's body and a stream's error line carry.
type ErrorBody struct {
	Error Error `json:"error"`
}

// OpenAI error types the problems map to.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
)

// codes are the error codes that differ from the problem slug written in
// snake case: OpenAI's own codes for the same conditions, which clients
// already test for.
var codes = map[string]string{
	protocol.ProblemUnauthorized: "invalid_api_key",
	protocol.ProblemRateLimited:  "rate_limit_exceeded",
	protocol.ProblemBodyTooLarge: "request_too_large",
	protocol.ProblemBadRequest:   "invalid_request",
}

// ErrorOf maps a problem to OpenAI's error object (docs/API.md lists the
// mapping). The type follows the status: 401 authentication_error, 429
// rate_limit_error, another 4xx invalid_request_error, 5xx server_error.
// The code is the problem slug in snake case unless OpenAI has its own.
// The message is the problem's detail, written for the client.
func ErrorOf(p *protocol.Problem) Error {
	slug := p.Slug()
	e := Error{Message: p.Detail, Code: codes[slug]}
	if e.Message == "" {
		e.Message = p.Title
	}
	if e.Code == "" {
		e.Code = strings.ReplaceAll(slug, "-", "_")
	}
	switch {
	case p.Status == 401:
		e.Type = TypeAuthentication
	case p.Status == 429:
		e.Type = TypeRateLimit
	case p.Status >= 400 && p.Status < 500:
		e.Type = TypeInvalidRequest
	default:
		e.Type = TypeServer
	}
	return e
}

// AppendErrorEvent appends the `data: {"error":{…}}` line that ends a
// stream which failed after it started.
func AppendErrorEvent(dst []byte, p *protocol.Problem) []byte {
	b, _ := json.Marshal(ErrorBody{Error: ErrorOf(p)}) // strings only
	dst = append(dst, "data: "...)
	dst = append(dst, b...)
	return append(dst, "\n\n"...)
}

// Model is one entry of the model list.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}
