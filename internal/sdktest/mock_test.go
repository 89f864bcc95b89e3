package sdktest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// The mock's scripted answers. Each request gets one, chosen from what it
// carries, so an SDK's multi-step loop gets a tool call, then text.
const (
	plainText     = "Hello from the mock: naïve café ☕ 🌊 done."
	toolFinalText = "It is sunny in Paris, 21 degrees."
	imageText     = "I see one red pixel."
	reasonText    = "Thinking about the weather in Paris first. "
	reasonAnswer  = "Sunny."
	jsonAnswer    = `{"city":"Paris","temperature":21}`
	toolName      = "get_weather"
	toolCallID    = "call_mock_1"
	toolArgs      = `{"city":"Paris"}`
	mockModel     = "mock-model"
	// reasonMarker in a prompt asks the mock for reasoning deltas.
	reasonMarker = "Think step by step"
)

// plainUsage is the usage the mock reports; detailedUsage has the
// details a proxy that names three fields drops, reported when the prompt
// carries detailsMarker.
var (
	plainUsage    = map[string]any{"prompt_tokens": 42, "completion_tokens": 17, "total_tokens": 59}
	detailedUsage = map[string]any{
		"prompt_tokens": 42, "completion_tokens": 17, "total_tokens": 59,
		"prompt_tokens_details":     map[string]any{"cached_tokens": 8, "audio_tokens": 0},
		"completion_tokens_details": map[string]any{"reasoning_tokens": 5, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
	}
)

const detailsMarker = "with usage details"

// mockModels is the mock's GET /v1/models, with fields of its own.
const mockModels = `{"object":"list","data":[{"id":"mock-model","object":"model","created":1715367049,"owned_by":"mock","max_model_len":128000},{"id":"mock-reasoner","object":"model","created":1715367050,"owned_by":"mock","capabilities":{"reasoning":true}}]}`

var caseRE = regexp.MustCompile(`\[case:([a-z0-9-]+)\]`)

// mock is a recording OpenAI-compatible upstream: chat completions
// (streamed and not), the Responses API (text), and the model list. It
// keeps every request body it received under the case marker its prompt
// carries ([case:name]).
type mock struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies map[string][]recorded
}

// recorded is one request the mock received.
type recorded struct {
	Path string
	Body json.RawMessage
}

func newMock(tb testing.TB) *mock {
	tb.Helper()
	m := &mock{bodies: make(map[string][]recorded)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, mockModels)
	})
	mux.HandleFunc("POST /v1/chat/completions", m.chat)
	mux.HandleFunc("POST /v1/responses", m.responses)
	m.srv = httptest.NewServer(mux)
	tb.Cleanup(m.srv.Close)
	return m
}

// url is the mock's base URL, as an SDK's baseURL or LLM_BASE_URL.
func (m *mock) url() string { return m.srv.URL + "/v1" }

// received returns the bodies recorded for a case, in arrival order.
func (m *mock) received(name string) []recorded {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]recorded(nil), m.bodies[name]...)
}

func (m *mock) record(r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, false
	}
	name := "unmarked"
	if sm := caseRE.FindSubmatch(body); sm != nil {
		name = string(sm[1])
	}
	m.mu.Lock()
	m.bodies[name] = append(m.bodies[name], recorded{Path: r.URL.Path, Body: body})
	m.mu.Unlock()
	return body, true
}

// chatRequest is what the mock reads of a request to pick its answer.
type chatRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Messages []struct {
		Role string `json:"role"`
	} `json:"messages"`
	Tools           []json.RawMessage `json:"tools"`
	ResponseFormat  json.RawMessage   `json:"response_format"`
	ReasoningEffort string            `json:"reasoning_effort"`
}

// answer is a scripted answer: content pieces, reasoning pieces, or a
// tool call whose arguments come in pieces.
type answer struct {
	reasoning []string
	content   []string
	toolArgs  []string
	finish    string
}

func pick(req chatRequest, raw []byte) answer {
	last := ""
	if n := len(req.Messages); n > 0 {
		last = req.Messages[n-1].Role
	}
	switch {
	case last == "tool":
		return answer{content: []string{"It is sunny ", "in Paris, ", "21 degrees."}, finish: "stop"}
	case len(req.Tools) > 0:
		return answer{toolArgs: []string{`{"ci`, `ty":"`, `Paris"}`}, finish: "tool_calls"}
	case len(req.ResponseFormat) > 0 && string(req.ResponseFormat) != "null":
		return answer{content: []string{`{"city":`, `"Paris","temp`, `erature":21}`}, finish: "stop"}
	case req.ReasoningEffort != "" || bytes.Contains(raw, []byte(reasonMarker)):
		return answer{reasoning: []string{"Thinking about ", "the weather ", "in Paris first. "}, content: []string{"Sunny."}, finish: "stop"}
	case bytes.Contains(raw, []byte(`"image_url"`)):
		return answer{content: []string{"I see one ", "red pixel."}, finish: "stop"}
	}
	return answer{content: []string{"Hello from the mock: naï", "ve café ☕", " 🌊 done."}, finish: "stop"}
}

func (m *mock) chat(w http.ResponseWriter, r *http.Request) {
	raw, ok := m.record(r)
	var req chatRequest
	if !ok || json.Unmarshal(raw, &req) != nil {
		http.Error(w, `{"error":{"message":"bad body","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	model := req.Model
	if model == "" {
		model = mockModel
	}
	a := pick(req, raw)
	usage := plainUsage
	if bytes.Contains(raw, []byte(detailsMarker)) {
		usage = detailedUsage
	}
	if req.Stream {
		streamChat(w, model, a, req.StreamOptions.IncludeUsage, usage)
		return
	}
	msg := map[string]any{"role": "assistant", "content": nil, "refusal": nil}
	if len(a.content) > 0 {
		msg["content"] = strings.Join(a.content, "")
	}
	if len(a.reasoning) > 0 {
		msg["reasoning_content"] = strings.Join(a.reasoning, "")
	}
	if len(a.toolArgs) > 0 {
		msg["tool_calls"] = []any{map[string]any{"id": toolCallID, "type": "function",
			"function": map[string]any{"name": toolName, "arguments": strings.Join(a.toolArgs, "")}}}
	}
	writeJSON(w, map[string]any{
		"id": "chatcmpl-mock", "object": "chat.completion", "created": 1764000000, "model": model,
		"system_fingerprint": "fp_mock", "service_tier": "default",
		"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": a.finish}},
		"usage":   usage,
	})
}

func streamChat(w http.ResponseWriter, model string, a answer, includeUsage bool, usage map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	flusher, _ := w.(http.Flusher)
	send := func(choices []any, usage any) {
		chunk := map[string]any{"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1764000000,
			"model": model, "system_fingerprint": "fp_mock", "service_tier": "default", "choices": choices}
		if usage != nil {
			chunk["usage"] = usage
		}
		b, _ := json.Marshal(chunk)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	delta := func(d map[string]any, finish any) []any {
		return []any{map[string]any{"index": 0, "delta": d, "logprobs": nil, "finish_reason": finish}}
	}
	send(delta(map[string]any{"role": "assistant", "content": ""}, nil), nil)
	for _, p := range a.reasoning {
		send(delta(map[string]any{"reasoning_content": p}, nil), nil)
	}
	for _, p := range a.content {
		send(delta(map[string]any{"content": p}, nil), nil)
	}
	for i, p := range a.toolArgs {
		tc := map[string]any{"index": 0, "function": map[string]any{"arguments": p}}
		if i == 0 {
			tc["id"], tc["type"] = toolCallID, "function"
			tc["function"].(map[string]any)["name"] = toolName
		}
		send(delta(map[string]any{"tool_calls": []any{tc}}, nil), nil)
	}
	send(delta(map[string]any{}, a.finish), nil)
	if includeUsage {
		send([]any{}, usage)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// responses answers the Responses API with text: the object, or its
// response.* events.
func (m *mock) responses(w http.ResponseWriter, r *http.Request) {
	raw, ok := m.record(r)
	var req struct {
		Model  string            `json:"model"`
		Stream bool              `json:"stream"`
		Tools  []json.RawMessage `json:"tools"`
		Input  json.RawMessage   `json:"input"`
	}
	if !ok || json.Unmarshal(raw, &req) != nil {
		http.Error(w, `{"error":{"message":"bad body","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	pieces := []string{"Hello from ", "the Responses ", "API."}
	switch {
	case bytes.Contains(req.Input, []byte(`"function_call_output"`)):
		pieces = []string{"It is sunny ", "in Paris, ", "21 degrees."}
	case len(req.Tools) > 0:
		m.responsesToolCall(w, req.Model, req.Stream)
		return
	}
	usage := map[string]any{"input_tokens": 42, "input_tokens_details": map[string]any{"cached_tokens": 8},
		"output_tokens": 17, "output_tokens_details": map[string]any{"reasoning_tokens": 5}, "total_tokens": 59}
	item := func(status string, text *string) map[string]any {
		content := []any{}
		if text != nil {
			content = []any{map[string]any{"type": "output_text", "text": *text, "annotations": []any{}, "logprobs": []any{}}}
		}
		return map[string]any{"type": "message", "id": "msg_mock", "status": status, "role": "assistant", "content": content}
	}
	resp := func(status string, output []any, usage any) map[string]any {
		return map[string]any{"id": "resp_mock", "object": "response", "created_at": 1764000000, "status": status,
			"model": req.Model, "output": output, "usage": usage, "error": nil, "incomplete_details": nil}
	}
	full := strings.Join(pieces, "")
	done := resp("completed", []any{item("completed", &full)}, usage)
	if !req.Stream {
		writeJSON(w, done)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	seq := 0
	send := func(typ string, ev map[string]any) {
		ev["type"], ev["sequence_number"] = typ, seq
		seq++
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	send("response.created", map[string]any{"response": resp("in_progress", []any{}, nil)})
	send("response.output_item.added", map[string]any{"output_index": 0, "item": item("in_progress", nil)})
	send("response.content_part.added", map[string]any{"item_id": "msg_mock", "output_index": 0, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
	for _, p := range pieces {
		send("response.output_text.delta", map[string]any{"item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": p, "logprobs": []any{}})
	}
	send("response.output_text.done", map[string]any{"item_id": "msg_mock", "output_index": 0, "content_index": 0, "text": full, "logprobs": []any{}})
	send("response.output_item.done", map[string]any{"output_index": 0, "item": item("completed", &full)})
	send("response.completed", map[string]any{"response": done})
}

// responsesToolCall answers the Responses API with one function call,
// its arguments streamed in pieces.
func (m *mock) responsesToolCall(w http.ResponseWriter, model string, stream bool) {
	args := []string{`{"ci`, `ty":"`, `Paris"}`}
	call := func(status, arguments string) map[string]any {
		return map[string]any{"type": "function_call", "id": "fc_mock", "call_id": toolCallID, "name": toolName,
			"arguments": arguments, "status": status}
	}
	usage := map[string]any{"input_tokens": 42, "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": 17, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 59}
	resp := func(status string, output []any, usage any) map[string]any {
		return map[string]any{"id": "resp_mock", "object": "response", "created_at": 1764000000, "status": status,
			"model": model, "output": output, "usage": usage, "error": nil, "incomplete_details": nil}
	}
	done := resp("completed", []any{call("completed", strings.Join(args, ""))}, usage)
	if !stream {
		writeJSON(w, done)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	seq := 0
	send := func(typ string, ev map[string]any) {
		ev["type"], ev["sequence_number"] = typ, seq
		seq++
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	send("response.created", map[string]any{"response": resp("in_progress", []any{}, nil)})
	send("response.output_item.added", map[string]any{"output_index": 0, "item": call("in_progress", "")})
	for _, p := range args {
		send("response.function_call_arguments.delta", map[string]any{"item_id": "fc_mock", "output_index": 0, "delta": p})
	}
	send("response.function_call_arguments.done", map[string]any{"item_id": "fc_mock", "output_index": 0, "arguments": strings.Join(args, "")})
	send("response.output_item.done", map[string]any{"output_index": 0, "item": call("completed", strings.Join(args, ""))})
	send("response.completed", map[string]any{"response": done})
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
