package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/bounds"
)

// maxMessagesHardLimit bounds messages in a decoded job whatever the api's
// configured MAX_MESSAGES; the api enforced its own limit before enqueueing.
const maxMessagesHardLimit = 100000

// Limits are the configurable bounds the request decoders enforce.
type Limits struct {
	MaxMessages int // MAX_MESSAGES, default 1000
	MaxTokens   int // MAX_TOKENS_LIMIT, default 1048576
	MaxChoices  int // MAX_CHOICES, default 8
}

// Validate reports each limit below 1 as a *bounds.Error. The decoders
// take a zero MaxTokens or MaxChoices as its default; a configured
// Limits has every one set.
func (l Limits) Validate() error {
	return errors.Join(
		bounds.AtLeast("MaxMessages", l.MaxMessages, 1),
		bounds.AtLeast("MaxTokens", l.MaxTokens, 1),
		bounds.AtLeast("MaxChoices", l.MaxChoices, 1),
	)
}

// DefaultLimits are the limits docs/OPERATIONS.md gives as defaults.
var DefaultLimits = Limits{MaxMessages: 1000, MaxTokens: 1 << 20, MaxChoices: 8}

// hardLimits are what a worker checks a queued body against: the api
// applied its configured limits before it enqueued the job.
var hardLimits = Limits{MaxMessages: maxMessagesHardLimit, MaxTokens: 1 << 30, MaxChoices: 128}

// ErrInvalidRequest is wrapped by every validation error of the request
// decoders; its message is safe to show to the client.
var ErrInvalidRequest = errors.New("invalid request")

// Routes: where a request came in. A queued job carries its route, so the
// worker calls the same upstream endpoint and the api writes the answer
// in the same dialect.
const (
	// RouteStream is POST /v1/stream: the native SSE dialect.
	RouteStream = "stream"
	// RouteChat is POST /v1/chat/completions.
	RouteChat = "chat"
	// RouteResponses is POST /v1/responses (OpenAI's Responses API).
	RouteResponses = "responses"
	// RouteEmbeddings is POST /v1/embeddings: a whole-answer call.
	RouteEmbeddings = "embeddings"
	// RouteCompletions is POST /v1/completions (legacy text completions):
	// a whole-answer call.
	RouteCompletions = "completions"
)

// Whole reports whether route's upstream call is a whole-answer call: the
// body is forwarded as sent (no stream patched in) and the upstream's one
// JSON answer is relayed as one raw chunk.
func Whole(route string) bool { return route == RouteEmbeddings || route == RouteCompletions }

// WholeAnswer reports whether req's upstream call answers with one JSON
// object: an embeddings request, or a completions request without
// stream (a streamed one is relayed chunk by chunk, as chat is).
func (req ChatRequest) WholeAnswer() bool {
	return req.Route == RouteEmbeddings || (req.Route == RouteCompletions && !req.Stream)
}

// roles are OpenAI's message roles (docs/API.md, "Input rules").
var roles = map[string]bool{
	"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true,
}

// rawRequest holds the fields the decoders check. Every other field of
// the body is forwarded as it was sent without being read.
type rawRequest struct {
	rawCommon
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	ThreadID            json.RawMessage `json:"thread_id"`
	Tools               json.RawMessage `json:"tools"`
	ReasoningEffort     json.RawMessage `json:"reasoning_effort"`
}

type rawMessage struct {
	Role    json.RawMessage `json:"role"`
	Content json.RawMessage `json:"content"`
}

type rawPart struct {
	Type string          `json:"type"`
	Text json.RawMessage `json:"text"`
}

type rawTool struct {
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
	} `json:"function"`
	Name string `json:"name"` // the Responses API's flat shape
}

// rawCommon holds the members every route's decoder checks alike.
type rawCommon struct {
	Model       json.RawMessage `json:"model"`
	Temperature json.RawMessage `json:"temperature"`
	N           json.RawMessage `json:"n"`
	Stream      json.RawMessage `json:"stream"`
}

// readCommon checks and reads model (a string of at most 256 bytes),
// temperature (0 to 2), n (1 to MaxChoices) and stream (a boolean).
func (req *ChatRequest) readCommon(c rawCommon, lim Limits) error {
	if !isNull(c.Model) && (json.Unmarshal(c.Model, &req.Model) != nil || len(req.Model) > 256) {
		return invalid("model must be a string of at most 256 characters")
	}
	if !isNull(c.Temperature) {
		var t float64
		if json.Unmarshal(c.Temperature, &t) != nil || t < 0 || t > 2 {
			return invalid("temperature must be a number between 0 and 2")
		}
		req.Temperature = &t
	}
	if !isNull(c.N) {
		n, ok := positiveInt(c.N)
		if !ok || n > int64(lim.MaxChoices) {
			return invalid("n must be an integer between 1 and %d", lim.MaxChoices)
		}
		req.N = int(n)
	}
	if !isNull(c.Stream) && json.Unmarshal(c.Stream, &req.Stream) != nil {
		return invalid("stream must be true or false")
	}
	return nil
}

// readTokens checks and reads a token cap sent in field: an integer from
// 1 to MaxTokens.
func (req *ChatRequest) readTokens(field string, v json.RawMessage, lim Limits) error {
	if isNull(v) {
		return nil
	}
	n, ok := positiveInt(v)
	if !ok || n > int64(lim.MaxTokens) {
		return invalid("%s must be an integer between 1 and %d", field, lim.MaxTokens)
	}
	req.MaxTokens, req.TokensField = int(n), field
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// DecodeChatRequest parses and validates a POST /v1/stream body: OpenAI's
// chat request, plus Spillway's `prompt` shorthand and `thread_id`, which
// are not forwarded. Every error wraps ErrInvalidRequest and its text is
// written for the client. It never panics.
func DecodeChatRequest(body []byte, lim Limits) (ChatRequest, error) {
	return decodeChat(body, lim, RouteStream, true, true)
}

// DecodeOpenAIChat parses and validates a POST /v1/chat/completions body,
// kept as sent to be forwarded (ChatRequest.Body).
func DecodeOpenAIChat(body []byte, lim Limits) (ChatRequest, error) {
	return decodeChat(body, lim, RouteChat, false, true)
}

// decodeChat validates body by docs/API.md's input rules and nothing
// more: what the upstream accepts is the upstream's to judge. native
// reads the /v1/stream extras (prompt, thread_id) and takes them out of
// the forwarded body. fast tries the one-pass reader first
// (readChatFast), which gives the same request and errors at a fraction
// of the cost; only its differential test turns it off.
func decodeChat(body []byte, lim Limits, route string, native, fast bool) (ChatRequest, error) {
	if lim.MaxChoices == 0 {
		lim.MaxChoices = DefaultLimits.MaxChoices
	}
	var raw rawRequest
	var f fastChat
	if fast {
		f, fast = readChatFast(body, lim.MaxMessages)
	}
	if fast {
		raw = f.raw
	} else if err := readBody(body, &raw); err != nil {
		return ChatRequest{}, err
	}
	req := ChatRequest{Route: route, Body: body, N: 1}
	hasPrompt := native && !isNull(raw.Prompt)
	var err error
	switch {
	case hasPrompt && !isNull(raw.Messages):
		return ChatRequest{}, invalid("give either messages or prompt, not both")
	case hasPrompt:
		var p string
		if json.Unmarshal(raw.Prompt, &p) != nil || p == "" {
			return ChatRequest{}, invalid("prompt must be a non-empty string")
		}
		req.Messages = []Message{{Role: "user", Content: p}}
		req.TextBytes = len(p)
	case !isNull(raw.Messages) && fast:
		req.Messages, req.TextBytes, req.NonTextParts = f.msgs, f.textBytes, f.nonText
	case !isNull(raw.Messages):
		if err := req.readMessages(raw.Messages, lim.MaxMessages); err != nil {
			return ChatRequest{}, err
		}
	default:
		return ChatRequest{}, invalid("messages is required")
	}
	if err := req.readCommon(raw.rawCommon, lim); err != nil {
		return ChatRequest{}, err
	}
	// max_completion_tokens replaced max_tokens in OpenAI's API; when both
	// are given the newer one is what the upstream honours.
	if err := req.readTokens("max_tokens", raw.MaxTokens, lim); err != nil {
		return ChatRequest{}, err
	}
	if err := req.readTokens("max_completion_tokens", raw.MaxCompletionTokens, lim); err != nil {
		return ChatRequest{}, err
	}
	if !isNull(raw.StreamOptions) {
		var so struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if raw.StreamOptions[0] != '{' || json.Unmarshal(raw.StreamOptions, &so) != nil {
			return ChatRequest{}, invalid("stream_options must be an object whose include_usage is true or false")
		}
		req.IncludeUsage = so.IncludeUsage != nil && *so.IncludeUsage
	}
	if !isNull(raw.ThreadID) {
		if json.Unmarshal(raw.ThreadID, &req.ThreadID) != nil || len(req.ThreadID) > 128 {
			return ChatRequest{}, invalid("thread_id must be a string of at most 128 characters")
		}
	}
	if !isNull(raw.Tools) {
		var tools []rawTool
		if json.Unmarshal(raw.Tools, &tools) != nil {
			return ChatRequest{}, invalid("tools must be an array of objects")
		}
		for _, t := range tools {
			req.Tools = append(req.Tools, cmpOr(t.Function.Name, t.Name))
		}
	}
	if !isNull(raw.ReasoningEffort) {
		_ = json.Unmarshal(raw.ReasoningEffort, &req.ReasoningEffort) // its value is the upstream's to judge
		if req.ReasoningEffort == "" {
			req.ReasoningEffort = "medium"
		}
	}
	if native {
		if req.Body, err = nativeBody(body, raw, hasPrompt, fast && !f.threadKey); err != nil {
			return ChatRequest{}, err
		}
	}
	return req, nil
}

// readBody checks what every request body must be (docs/API.md, "Input
// rules": valid UTF-8, no NUL raw or escaped, a JSON object nested at
// most 64 deep) and reads the members raw names into raw.
func readBody(body []byte, raw any) error {
	if !utf8.Valid(body) {
		return invalid("body is not valid UTF-8")
	}
	if hasNUL(body) {
		return invalid("body contains a NUL character")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return invalid("body must be a JSON object")
	}
	if err := strictUnmarshal(body, raw); err != nil {
		return invalid("malformed JSON: %s", JSONErrorText(err))
	}
	if tooDeep(body, maxDepth) {
		return invalid("body is nested deeper than %d levels", maxDepth)
	}
	return nil
}

// nativeBody is a /v1/stream body as the upstream gets it: `prompt`
// becomes the one user message it stands for, `thread_id` stays with
// Spillway (OpenAI refuses unknown parameters). noThreadKey says the body
// is known to have no member named thread_id, which spares a scan of it.
func nativeBody(body []byte, raw rawRequest, hasPrompt, noThreadKey bool) ([]byte, error) {
	out := body
	var ok bool
	if hasPrompt {
		msgs := append([]byte(`[{"role":"user","content":`), bytes.TrimSpace(raw.Prompt)...)
		msgs = append(msgs, "}]"...)
		if out, ok = DeleteMember(out, "prompt"); ok {
			out, ok = SetMember(out, "messages", msgs)
		}
		if !ok {
			return nil, invalid("the request could not be read")
		}
	}
	if !isNull(raw.ThreadID) || (!noThreadKey && MemberValue(out, "thread_id") != nil) {
		if out, ok = DeleteMember(out, "thread_id"); !ok {
			return nil, invalid("the request could not be read")
		}
	}
	return out, nil
}

// readMessages checks the messages array and keeps its text view.
func (req *ChatRequest) readMessages(b json.RawMessage, max int) error {
	var list []json.RawMessage
	if json.Unmarshal(b, &list) != nil {
		return invalid("messages must be an array of objects")
	}
	if len(list) == 0 {
		return invalid("messages must not be empty")
	}
	if len(list) > max {
		return invalid("at most %d messages are allowed", max)
	}
	req.Messages = make([]Message, 0, len(list))
	for i, raw := range list {
		raw = bytes.TrimSpace(raw)
		var m rawMessage
		if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &m) != nil {
			return invalid("messages[%d] must be an object", i)
		}
		var role string
		if json.Unmarshal(m.Role, &role) != nil || !roles[role] {
			return invalid("messages[%d].role must be one of system, developer, user, assistant, tool, function", i)
		}
		text, err := req.readContent(i, m.Content)
		if err != nil {
			return err
		}
		req.Messages = append(req.Messages, Message{Role: role, Content: text})
	}
	return nil
}

// readContent checks one message's content: a string, null (or absent),
// or an array of parts of any type. It returns the text, the text parts
// joined by line breaks, and counts the other parts.
func (req *ChatRequest) readContent(i int, c json.RawMessage) (string, error) {
	c = bytes.TrimSpace(c)
	switch {
	case isNull(c):
		return "", nil
	case c[0] == '"':
		var s string
		if json.Unmarshal(c, &s) != nil {
			return "", invalid("messages[%d].content must be a string, null or an array of content parts", i)
		}
		req.TextBytes += len(s)
		return s, nil
	case c[0] == '[':
		var parts []json.RawMessage
		if json.Unmarshal(c, &parts) != nil {
			return "", invalid("messages[%d].content must be a string, null or an array of content parts", i)
		}
		var texts []string
		for j, p := range parts {
			p = bytes.TrimSpace(p)
			var part rawPart
			if len(p) == 0 || p[0] != '{' || json.Unmarshal(p, &part) != nil {
				return "", invalid("messages[%d].content[%d] must be an object", i, j)
			}
			var text string
			// "text" in chat messages; "input_text" and "output_text" in
			// the Responses API's items.
			isText := part.Type == "text" || part.Type == "input_text" || part.Type == "output_text"
			if isText && json.Unmarshal(part.Text, &text) == nil {
				texts = append(texts, text)
				req.TextBytes += len(text)
				continue
			}
			req.NonTextParts++
		}
		return strings.Join(texts, "\n"), nil
	}
	return "", invalid("messages[%d].content must be a string, null or an array of content parts", i)
}

// isNull reports an absent member or a JSON null.
func isNull(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

// positiveInt reads a JSON integer of at least 1.
func positiveInt(b json.RawMessage) (int64, bool) {
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return n, err == nil && n >= 1
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
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

// validateMessages checks the text view of messages built in code (a
// version 1 job's payload).
func validateMessages(msgs []Message, max int) error {
	if len(msgs) == 0 {
		return invalid("messages must not be empty")
	}
	if len(msgs) > max {
		return invalid("at most %d messages are allowed", max)
	}
	for i, m := range msgs {
		if !roles[m.Role] {
			return invalid("messages[%d].role must be one of system, developer, user, assistant, tool, function", i)
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

// rawResponsesRequest holds the fields of a Responses API request the
// decoder checks; every other field is forwarded as sent.
type rawResponsesRequest struct {
	rawCommon
	Input           json.RawMessage `json:"input"`
	MaxOutputTokens json.RawMessage `json:"max_output_tokens"`
	Tools           json.RawMessage `json:"tools"`
	Reasoning       json.RawMessage `json:"reasoning"`
}

// DecodeResponses parses and validates a POST /v1/responses body by the
// same input rules as a chat request: a JSON object of valid UTF-8, no
// NUL, nested at most 64 deep; `input` a string or an array of items
// (messages' text is read for the simulator and the token estimates);
// max_output_tokens up to MAX_TOKENS_LIMIT. The body is kept as sent.
func DecodeResponses(body []byte, lim Limits) (ChatRequest, error) {
	var raw rawResponsesRequest
	if err := readBody(body, &raw); err != nil {
		return ChatRequest{}, err
	}
	req := ChatRequest{Route: RouteResponses, Body: body, N: 1}
	in := bytes.TrimSpace(raw.Input)
	switch {
	case isNull(in):
		return ChatRequest{}, invalid("input is required")
	case in[0] == '"':
		var s string
		if json.Unmarshal(in, &s) != nil {
			return ChatRequest{}, invalid("input must be a string or an array of items")
		}
		req.Messages, req.TextBytes = []Message{{Role: "user", Content: s}}, len(s)
	case in[0] == '[':
		var items []json.RawMessage
		if json.Unmarshal(in, &items) != nil || len(items) == 0 {
			return ChatRequest{}, invalid("input must be a string or a non-empty array of items")
		}
		if len(items) > lim.MaxMessages {
			return ChatRequest{}, invalid("at most %d input items are allowed", lim.MaxMessages)
		}
		for i, it := range items {
			it = bytes.TrimSpace(it)
			var m struct {
				Role    string          `json:"role"`
				Content json.RawMessage `json:"content"`
				Output  json.RawMessage `json:"output"`
			}
			if len(it) == 0 || it[0] != '{' || json.Unmarshal(it, &m) != nil {
				return ChatRequest{}, invalid("input[%d] must be an object", i)
			}
			role := m.Role
			content := m.Content
			if role == "" { // a function call or its output: text for the view
				role, content = "tool", m.Output
			}
			text, err := req.readContent(i, content)
			if err != nil {
				text = "" // an item shape the upstream judges
			}
			req.Messages = append(req.Messages, Message{Role: role, Content: text})
		}
	default:
		return ChatRequest{}, invalid("input must be a string or an array of items")
	}
	if err := req.readCommon(raw.rawCommon, lim); err != nil {
		return ChatRequest{}, err
	}
	if err := req.readTokens("max_output_tokens", raw.MaxOutputTokens, lim); err != nil {
		return ChatRequest{}, err
	}
	if !isNull(raw.Tools) {
		var tools []rawTool
		if json.Unmarshal(raw.Tools, &tools) != nil {
			return ChatRequest{}, invalid("tools must be an array of objects")
		}
		for _, t := range tools {
			req.Tools = append(req.Tools, cmpOr(t.Function.Name, t.Name))
		}
	}
	if !isNull(raw.Reasoning) {
		req.ReasoningEffort = "medium"
	}
	return req, nil
}

// CapTokens lowers the request's token cap to max (degradation level 2,
// docs/OPERATIONS.md), in the field the client used, or max_tokens when
// it used none. A cap at or under max is left as it is.
func (req *ChatRequest) CapTokens(max int) {
	if max <= 0 || (req.MaxTokens > 0 && req.MaxTokens <= max) {
		return
	}
	if req.Route == RouteEmbeddings {
		return // an embedding has no tokens to cap
	}
	req.MaxTokens = max
	if req.Body == nil {
		return
	}
	field := cmpOr(req.TokensField, "max_tokens")
	if b, ok := SetMember(req.Body, field, strconv.AppendInt(nil, int64(max), 10)); ok {
		req.Body, req.TokensField = b, field
	}
}

// UpstreamBody returns the body to send upstream for req: its Body with
// only what Spillway owns changed (docs/API.md, "What passes untouched"):
// "stream" true, stream_options.include_usage true, and model set to
// defaultModel when the request names none. ok is false for a request
// built in code, which has no Body.
func (req *ChatRequest) UpstreamBody(defaultModel string) (body []byte, ok bool) {
	if req.Body == nil {
		return nil, false
	}
	if Whole(req.Route) {
		// Forwarded as sent, `stream` included (a completion streams only
		// when its client asked).
		if req.Model == "" && defaultModel != "" {
			return SetMember(req.Body, "model", AppendJSONString(nil, defaultModel))
		}
		return req.Body, true
	}
	body, ok = SetMember(req.Body, "stream", []byte("true"))
	if !ok {
		return nil, false
	}
	if req.Route == RouteResponses {
		// The Responses API streams its usage in response.completed and
		// knows no stream_options.
		if req.Model == "" && defaultModel != "" {
			body, ok = SetMember(body, "model", AppendJSONString(nil, defaultModel))
		}
		return body, ok
	}
	opts := []byte(`{"include_usage":true}`)
	if so := MemberValue(body, "stream_options"); so != nil && !isNull(so) {
		if opts, ok = SetMember(so, "include_usage", []byte("true")); !ok {
			return nil, false
		}
	}
	if body, ok = SetMember(body, "stream_options", opts); !ok {
		return nil, false
	}
	if req.Model == "" && defaultModel != "" {
		if body, ok = SetMember(body, "model", AppendJSONString(nil, defaultModel)); !ok {
			return nil, false
		}
	}
	return body, true
}

// rawWholeRequest holds the fields of a POST /v1/embeddings or
// /v1/completions body the decoder checks; every other field is
// forwarded as sent.
type rawWholeRequest struct {
	rawCommon
	Input     json.RawMessage `json:"input"`
	Prompt    json.RawMessage `json:"prompt"`
	MaxTokens json.RawMessage `json:"max_tokens"`
}

// DecodeEmbeddings parses and validates a POST /v1/embeddings body: only
// what protects Spillway (a JSON object of valid UTF-8, no NUL, nested at
// most 64 deep, `input` present); the upstream judges the rest. The body
// is kept as sent; the input's text is one user message for the
// simulator and the token estimates.
func DecodeEmbeddings(body []byte, lim Limits) (ChatRequest, error) {
	return decodeWhole(body, lim, RouteEmbeddings)
}

// DecodeCompletions parses and validates a POST /v1/completions body as
// DecodeEmbeddings does, with `prompt` required, max_tokens 1 to
// MAX_TOKENS_LIMIT and n 1 to MAX_CHOICES. Streaming is not relayed on
// this route: "stream": true is refused.
func DecodeCompletions(body []byte, lim Limits) (ChatRequest, error) {
	return decodeWhole(body, lim, RouteCompletions)
}

func decodeWhole(body []byte, lim Limits, route string) (ChatRequest, error) {
	if lim.MaxTokens == 0 {
		lim.MaxTokens = DefaultLimits.MaxTokens
	}
	if lim.MaxChoices == 0 {
		lim.MaxChoices = DefaultLimits.MaxChoices
	}
	var raw rawWholeRequest
	if err := readBody(body, &raw); err != nil {
		return ChatRequest{}, err
	}
	req := ChatRequest{Route: route, Body: body, N: 1}
	field, in := "input", raw.Input
	if route == RouteCompletions {
		field, in = "prompt", raw.Prompt
	}
	if isNull(in) {
		return ChatRequest{}, invalid("%s is required", field)
	}
	text := inputText(in)
	req.Messages, req.TextBytes = []Message{{Role: "user", Content: text}}, len(text)
	if err := req.readCommon(raw.rawCommon, lim); err != nil {
		return ChatRequest{}, err
	}
	if route == RouteCompletions {
		if err := req.readTokens("max_tokens", raw.MaxTokens, lim); err != nil {
			return ChatRequest{}, err
		}
	}
	return req, nil
}

// inputText is the text of an embeddings input or a completions prompt
// for the simulator and the token estimates: a string as it is, an array
// of strings joined by newlines; token arrays have no text.
func inputText(in json.RawMessage) string {
	var s string
	if json.Unmarshal(in, &s) == nil {
		return s
	}
	var ss []string
	if json.Unmarshal(in, &ss) == nil {
		return strings.Join(ss, "\n")
	}
	return ""
}
