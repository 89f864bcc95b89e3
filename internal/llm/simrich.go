package llm

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// The simulator's answers beyond plain text (docs/API.md, "The
// simulator"): a request that offers tools gets one deterministic call of
// its first tool, its arguments streamed in pieces, then finish_reason
// "tool_calls"; a request with reasoning_effort gets a few
// reasoning_content deltas first; a request with n > 1 gets n choices.
// These answers are made of chat.completion.chunk objects, as an
// upstream's are, so they travel on every path as an upstream's do.

// simToolArgsHint, followed by a JSON object in a message's text, gives the
// arguments of the simulated tool call (else they are {}).
const simToolArgsHint = "SIM_TOOL_ARGS="

// simReasoning is the reasoning a request with reasoning_effort gets,
// streamed a word at a time.
var simReasoning = []string{"Thinking", " about", " the", " question."}

// rich reports whether req asks for more than plain text of one choice.
func rich(req protocol.ChatRequest) bool {
	return req.N > 1 || req.ReasoningEffort != "" || wantsToolCall(req)
}

// wantsToolCall reports whether the simulator answers req with a tool
// call: it offers tools and its last message is not a tool's result (a
// tool loop's next turn gets text, so agents end).
func wantsToolCall(req protocol.ChatRequest) bool {
	if len(req.Tools) == 0 || req.Tools[0] == "" {
		return false
	}
	last := req.Messages[len(req.Messages)-1].Role
	return last != "tool" && last != "function"
}

// simChunkWriter builds the chunks of one rich answer.
type simChunkWriter struct {
	head []byte // {"id":…,"object":…,"created":…,"model":…,
}

func newSimChunkWriter(model string) simChunkWriter {
	if model == "" {
		model = "sim-1"
	}
	h := []byte(`{"id":"chatcmpl-sim","object":"chat.completion.chunk","created":`)
	h = strconv.AppendInt(h, time.Now().Unix(), 10)
	h = append(h, `,"model":`...)
	h = protocol.AppendJSONString(h, model)
	return simChunkWriter{head: append(h, `,"system_fingerprint":"fp_sim",`...)}
}

// choice returns a chunk of one choice with the delta's members (already
// JSON) and finish reason (empty: null).
func (w simChunkWriter) choice(index int, delta string, finish string) []byte {
	b := append([]byte(nil), w.head...)
	b = append(b, `"choices":[{"index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"delta":{`...)
	b = append(b, delta...)
	b = append(b, `},"logprobs":null,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = protocol.AppendJSONString(b, finish)
	}
	return append(b, "}]}"...)
}

func (w simChunkWriter) usage(u protocol.Usage) []byte {
	b := append([]byte(nil), w.head...)
	ub, _ := json.Marshal(u) // ints only
	b = append(b, `"choices":[],"usage":`...)
	return append(append(b, ub...), '}')
}

// richSteps returns the chunks of the rich answer to req whose text is
// chunks, and its finish reason.
func richSteps(req protocol.ChatRequest, chunks []string, finish string) ([]protocol.Chunk, string) {
	w := newSimChunkWriter(req.Model)
	n := max(1, req.N)
	var out []protocol.Chunk
	add := func(index int, delta, fin string, content string, extra bool) {
		out = append(out, protocol.Chunk{Content: content, Raw: w.choice(index, delta, fin), Extra: extra || index != 0})
	}
	for i := range n {
		add(i, `"role":"assistant","content":""`, "", "", false)
	}
	if req.ReasoningEffort != "" {
		for _, r := range simReasoning {
			for i := range n {
				add(i, `"reasoning_content":`+string(protocol.AppendJSONString(nil, r)), "", "", true)
			}
		}
	}
	if wantsToolCall(req) {
		name, args := req.Tools[0], simToolArgs(req.Messages)
		id := simCallID(req.Messages)
		for i := range n {
			head := `"tool_calls":[{"index":0,"id":` + string(protocol.AppendJSONString(nil, id)) +
				`,"type":"function","function":{"name":` + string(protocol.AppendJSONString(nil, name)) + `,"arguments":""}}]`
			add(i, head, "", "", true)
		}
		for _, piece := range splitArgs(args) {
			for i := range n {
				add(i, `"tool_calls":[{"index":0,"function":{"arguments":`+string(protocol.AppendJSONString(nil, piece))+`}}]`, "", "", true)
			}
		}
		finish = "tool_calls"
	} else {
		for _, c := range chunks {
			for i := range n {
				add(i, `"content":`+string(protocol.AppendJSONString(nil, c)), "", c, false)
			}
		}
	}
	for i := range n {
		add(i, "", finish, "", false)
	}
	return out, finish
}

// simToolArgs returns the tool call's arguments: the JSON object after
// SIM_TOOL_ARGS= in the last message that has one, else {}.
func simToolArgs(msgs []protocol.Message) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		_, after, ok := strings.Cut(msgs[i].Content, simToolArgsHint)
		if !ok {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(after))
		var raw json.RawMessage
		if dec.Decode(&raw) == nil && len(raw) > 0 && raw[0] == '{' {
			var buf bytes.Buffer
			if json.Compact(&buf, raw) == nil {
				return buf.String()
			}
		}
	}
	return "{}"
}

// simCallID is the tool call's id, the same for the same messages.
func simCallID(msgs []protocol.Message) string {
	h := fnv.New64a()
	for _, m := range msgs {
		h.Write([]byte(m.Role))
		h.Write([]byte{0})
		h.Write([]byte(m.Content))
		h.Write([]byte{0})
	}
	return "call_" + strconv.FormatUint(h.Sum64(), 36)
}

// splitArgs cuts args into three pieces or fewer (at least one), as an
// upstream streams a tool call's arguments.
func splitArgs(args string) []string {
	if len(args) < 3 {
		return []string{args}
	}
	a, b := runeStart(args, len(args)/3), runeStart(args, 2*len(args)/3)
	return []string{args[:a], args[a:b], args[b:]}
}

// runeStart moves i back to the start of the character it falls in.
func runeStart(s string, i int) int {
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}

// responsesSteps is the simulator's answer to a Responses API request
// (POST /v1/responses): the events an upstream streams for one message
// of text, from response.created to response.completed, the text deltas
// being chunks.
func responsesSteps(req protocol.ChatRequest, chunks []string, usage protocol.Usage, finish string) []protocol.Chunk {
	model := req.Model
	if model == "" {
		model = "sim-1"
	}
	id, itemID := "resp_"+simCallID(req.Messages)[len("call_"):], "msg_"+simCallID(req.Messages)[len("call_"):]
	created := time.Now().Unix()
	text := strings.Join(chunks, "")
	status := "completed"
	if finish == "length" {
		status = "incomplete"
	}
	part := func(t string) map[string]any {
		return map[string]any{"type": "output_text", "text": t, "annotations": []any{}}
	}
	item := func(st string, content []any) map[string]any {
		return map[string]any{"id": itemID, "type": "message", "status": st, "role": "assistant", "content": content}
	}
	response := func(st string, output []any, u map[string]any) map[string]any {
		r := map[string]any{"id": id, "object": "response", "created_at": created, "status": st, "model": model, "output": output}
		if u != nil {
			r["usage"] = u
		}
		return r
	}
	var out []protocol.Chunk
	seq := 0
	add := func(ev map[string]any, content string) {
		ev["sequence_number"] = seq
		seq++
		b, _ := json.Marshal(ev) // maps of strings, numbers and slices
		typ, _ := ev["type"].(string)
		out = append(out, protocol.Chunk{Content: content, Raw: b, Extra: typ != "response.created" && typ != "response.in_progress"})
	}
	add(map[string]any{"type": "response.created", "response": response("in_progress", []any{}, nil)}, "")
	add(map[string]any{"type": "response.output_item.added", "output_index": 0, "item": item("in_progress", []any{})}, "")
	add(map[string]any{"type": "response.content_part.added", "item_id": itemID, "output_index": 0, "content_index": 0, "part": part("")}, "")
	for _, c := range chunks {
		add(map[string]any{"type": "response.output_text.delta", "item_id": itemID, "output_index": 0, "content_index": 0, "delta": c}, c)
	}
	add(map[string]any{"type": "response.output_text.done", "item_id": itemID, "output_index": 0, "content_index": 0, "text": text}, "")
	add(map[string]any{"type": "response.content_part.done", "item_id": itemID, "output_index": 0, "content_index": 0, "part": part(text)}, "")
	done := item("completed", []any{part(text)})
	add(map[string]any{"type": "response.output_item.done", "output_index": 0, "item": done}, "")
	add(map[string]any{"type": "response." + status, "response": response(status, []any{done}, map[string]any{
		"input_tokens": usage.PromptTokens, "output_tokens": usage.CompletionTokens, "total_tokens": usage.TotalTokens,
	})}, "")
	return out
}

// wholeSteps is the simulator's answer to a whole-answer route, one raw
// chunk: for POST /v1/embeddings a list of one 8-dimension embedding
// drawn from a hash of the input (the same input, the same vector), for
// POST /v1/completions a text_completion of the simulated text in each
// of its n choices.
func wholeSteps(req protocol.ChatRequest, chunks []string, usage protocol.Usage, finish string) []protocol.Chunk {
	model := req.Model
	if model == "" {
		model = "sim-1"
	}
	var ans map[string]any
	if req.Route == protocol.RouteEmbeddings {
		h := sha256.Sum256([]byte(req.Messages[0].Content))
		vec := make([]float64, 8)
		for i := range vec {
			// A value in [-1, 1) from two bytes of the hash.
			vec[i] = float64(int(h[2*i])<<8|int(h[2*i+1]))/32768 - 1
		}
		ans = map[string]any{
			"object": "list",
			"data":   []any{map[string]any{"object": "embedding", "index": 0, "embedding": vec}},
			"model":  model,
			"usage":  map[string]any{"prompt_tokens": usage.PromptTokens, "total_tokens": usage.PromptTokens},
		}
	} else {
		text := strings.Join(chunks, "")
		choices := make([]any, max(1, req.N))
		for i := range choices {
			choices[i] = map[string]any{"text": text, "index": i, "logprobs": nil, "finish_reason": finish}
		}
		ans = map[string]any{
			"id":      "cmpl-" + simCallID(req.Messages)[len("call_"):],
			"object":  "text_completion",
			"created": time.Now().Unix(),
			"model":   model,
			"choices": choices,
			"usage": map[string]any{"prompt_tokens": usage.PromptTokens, "completion_tokens": usage.CompletionTokens,
				"total_tokens": usage.TotalTokens},
		}
	}
	b, _ := json.Marshal(ans) // maps of strings, numbers and slices
	return []protocol.Chunk{{Raw: b, Extra: true}}
}

// completionsSteps is the simulator's streamed answer to a legacy
// completion (POST /v1/completions with stream): text_completion chunks
// of each choice's text, then each choice's finish reason.
func completionsSteps(req protocol.ChatRequest, chunks []string, finish string) []protocol.Chunk {
	model := req.Model
	if model == "" {
		model = "sim-1"
	}
	head := []byte(`{"id":"cmpl-` + simCallID(req.Messages)[len("call_"):] + `","object":"text_completion","created":`)
	head = strconv.AppendInt(head, time.Now().Unix(), 10)
	head = append(head, `,"model":`...)
	head = protocol.AppendJSONString(head, model)
	one := func(index int, text, fin string) []byte {
		b := append(append([]byte(nil), head...), `,"choices":[{"text":`...)
		b = protocol.AppendJSONString(b, text)
		b = append(b, `,"index":`...)
		b = strconv.AppendInt(b, int64(index), 10)
		b = append(b, `,"logprobs":null,"finish_reason":`...)
		if fin == "" {
			b = append(b, "null"...)
		} else {
			b = protocol.AppendJSONString(b, fin)
		}
		return append(b, "}]}"...)
	}
	n := max(1, req.N)
	var out []protocol.Chunk
	for _, c := range chunks {
		for i := range n {
			out = append(out, protocol.Chunk{Content: c, Raw: one(i, c, ""), Extra: i != 0})
		}
	}
	for i := range n {
		out = append(out, protocol.Chunk{Raw: one(i, "", finish), Extra: i != 0})
	}
	return out
}
