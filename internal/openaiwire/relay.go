package openaiwire

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// An upstream's chat.completion.chunk travels as it came (docs/API.md,
// "Answer: relayed as answered"). These read what Spillway needs of one
// and write it in each dialect: the OpenAI one with only the id made
// ours, /v1/stream's events with the deltas it shows, and the
// chat.completion object a request without stream gets.

// AppendChunkEvent appends the SSE event `data: {chunk}` of the raw chunk
// with its id replaced by id (already a JSON string). The rest of the
// chunk is copied byte for byte.
func AppendChunkEvent(dst, raw, id []byte) []byte {
	dst = append(dst, "data: "...)
	dst = appendWithID(dst, raw, id)
	return append(dst, "\n\n"...)
}

// appendWithID appends raw with its top-level id set to id. The common
// case, a chunk that starts with an id free of escapes, is spliced in
// place without a scan of the rest.
func appendWithID(dst, raw, id []byte) []byte {
	const head = `{"id":"`
	if bytes.HasPrefix(raw, []byte(head)) {
		rest := raw[len(head):]
		if end := bytes.IndexByte(rest, '"'); end >= 0 && bytes.IndexByte(rest[:end], '\\') < 0 {
			dst = append(dst, `{"id":`...)
			dst = append(dst, id...)
			return append(dst, rest[end+1:]...)
		}
	}
	if out, ok := protocol.SetMember(raw, "id", id); ok {
		return append(dst, out...)
	}
	return append(dst, raw...)
}

// wireChunk is what the dialects read of a chunk. The deltas that travel
// on are kept as raw JSON.
type wireChunk struct {
	ID                string          `json:"id"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint json.RawMessage `json:"system_fingerprint"`
	ServiceTier       json.RawMessage `json:"service_tier"`
	Choices           []wireChoice    `json:"choices"`
	Usage             json.RawMessage `json:"usage"`
}

type wireChoice struct {
	Index        int             `json:"index"`
	Delta        wireDelta       `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type wireDelta struct {
	Role             string          `json:"role"`
	Content          *string         `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	Reasoning        *string         `json:"reasoning"`
	Refusal          *string         `json:"refusal"`
	ToolCalls        []wireToolCall  `json:"tool_calls"`
	Audio            json.RawMessage `json:"audio"`
	FunctionCall     json.RawMessage `json:"function_call"`
}

type wireToolCall struct {
	Index    int    `json:"index"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
	raw json.RawMessage
}

func (t *wireToolCall) UnmarshalJSON(b []byte) error {
	type plain wireToolCall
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*t = wireToolCall(p)
	t.raw = append(json.RawMessage(nil), b...)
	return nil
}

func nonNull(b json.RawMessage) bool { return len(b) > 0 && string(b) != "null" }

// AppendNativeEvents appends, for each choice of the raw chunk that shows
// something, the data of a /v1/stream chunk event (docs/API.md): content
// and, when the upstream sent them, reasoning, tool_calls (OpenAI's delta
// shape), refusal, audio, logprobs, and choice when withChoice (n > 1) or
// the choice is not the first. A choice whose delta holds none of these
// (a role preamble, a finish reason, usage) shows nothing: the done event
// carries the finish reason and usage. It returns one data slice per
// event, in order, all in dst.
func AppendNativeEvents(dst []byte, raw []byte, withChoice bool) ([]byte, [][2]int) {
	var c wireChunk
	if json.Unmarshal(raw, &c) != nil {
		return dst, nil
	}
	var spans [][2]int
	for _, ch := range c.Choices {
		d := ch.Delta
		reasoning := d.ReasoningContent
		if reasoning == nil {
			reasoning = d.Reasoning
		}
		content := ""
		if d.Content != nil {
			content = *d.Content
		}
		shows := content != "" || (reasoning != nil && *reasoning != "") || len(d.ToolCalls) > 0 ||
			(d.Refusal != nil && *d.Refusal != "") || nonNull(d.Audio) || nonNull(d.FunctionCall) || nonNull(ch.Logprobs)
		if !shows {
			continue
		}
		from := len(dst)
		dst = append(dst, `{"content":`...)
		dst = protocol.AppendJSONString(dst, content)
		if reasoning != nil && *reasoning != "" {
			dst = append(dst, `,"reasoning":`...)
			dst = protocol.AppendJSONString(dst, *reasoning)
		}
		if len(d.ToolCalls) > 0 {
			dst = append(dst, `,"tool_calls":[`...)
			for k, tc := range d.ToolCalls {
				if k > 0 {
					dst = append(dst, ',')
				}
				dst = append(dst, compact(tc.raw)...)
			}
			dst = append(dst, ']')
		}
		if nonNull(d.FunctionCall) {
			dst = append(append(dst, `,"function_call":`...), compact(d.FunctionCall)...)
		}
		if d.Refusal != nil && *d.Refusal != "" {
			dst = append(dst, `,"refusal":`...)
			dst = protocol.AppendJSONString(dst, *d.Refusal)
		}
		if nonNull(d.Audio) {
			dst = append(append(dst, `,"audio":`...), compact(d.Audio)...)
		}
		if nonNull(ch.Logprobs) {
			dst = append(append(dst, `,"logprobs":`...), compact(ch.Logprobs)...)
		}
		if withChoice || ch.Index != 0 {
			dst = append(dst, `,"choice":`...)
			dst = strconv.AppendInt(dst, int64(ch.Index), 10)
		}
		dst = append(dst, '}')
		spans = append(spans, [2]int{from, len(dst)})
	}
	return dst, spans
}

// compact returns b on one line.
func compact(b []byte) []byte {
	if !bytes.ContainsAny(b, " \t\r\n") {
		return b
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}

// IsPreamble reports whether raw shows no output: every choice's delta
// holds at most a role and empty content, with no finish reason.
func IsPreamble(raw []byte) bool {
	var c wireChunk
	if json.Unmarshal(raw, &c) != nil {
		return false
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		if (d.Content != nil && *d.Content != "") || d.ReasoningContent != nil || d.Reasoning != nil || d.Refusal != nil ||
			len(d.ToolCalls) > 0 || nonNull(d.Audio) || nonNull(d.FunctionCall) || nonNull(ch.Logprobs) || ch.FinishReason != nil {
			return false
		}
	}
	return true
}

// IsUsageChunk reports whether raw is a chunk of usage only (no choices),
// which a client gets only when it asked for stream_options.include_usage.
func IsUsageChunk(raw []byte) bool {
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
	}
	return json.Unmarshal(raw, &c) == nil && len(c.Choices) == 0 && nonNull(c.Usage)
}

// Assembler builds the chat.completion object of an answer from its
// chunks, as the upstream would have answered without stream: content,
// reasoning and refusals joined, tool call arguments joined by index,
// every choice, logprobs, the usage with its details.
type Assembler struct {
	id, model         string
	created           int64
	fingerprint, tier json.RawMessage
	choices           map[int]*assembled
	usage             json.RawMessage
}

type assembled struct {
	content, reasoning, refusal []byte
	hasContent, hasRefusal      bool
	reasoningKey                string
	tools                       map[int]*assembledTool
	logprobsContent             []json.RawMessage
	logprobsRefusal             []json.RawMessage
	hasLogprobs                 bool
	audio                       json.RawMessage
	finish                      *string
}

type assembledTool struct {
	id, typ, name string
	args          []byte
}

// NewAssembler returns the assembler of the answer to requestID for a
// request of model (used until a chunk names the upstream's).
func NewAssembler(requestID, model string, created int64) *Assembler {
	return &Assembler{id: CompletionID(requestID), model: model, created: created, choices: map[int]*assembled{}}
}

func (a *Assembler) choice(i int) *assembled {
	c := a.choices[i]
	if c == nil {
		c = &assembled{tools: map[int]*assembledTool{}}
		a.choices[i] = c
	}
	return c
}

// Content adds plain content to choice 0 (a chunk that came without raw).
func (a *Assembler) Content(s string) {
	c := a.choice(0)
	c.content = append(c.content, s...)
	c.hasContent = true
}

// Finish sets choice 0's finish reason unless a chunk gave one, and the
// usage unless a chunk carried it.
func (a *Assembler) Finish(reason string, usage *protocol.Usage) {
	c := a.choice(0)
	if c.finish == nil {
		c.finish = &reason
	}
	if a.usage == nil && usage != nil {
		a.usage, _ = json.Marshal(usage)
	}
}

// Reset forgets the chunks so far: another attempt starts.
func (a *Assembler) Reset() {
	a.choices = map[int]*assembled{}
	a.usage = nil
}

// Chunk adds one raw chunk.
func (a *Assembler) Chunk(raw []byte) {
	var c wireChunk
	if json.Unmarshal(raw, &c) != nil {
		return
	}
	if c.Model != "" {
		a.model = c.Model
	}
	if c.Created != 0 {
		a.created = c.Created
	}
	if nonNull(c.SystemFingerprint) {
		a.fingerprint = c.SystemFingerprint
	}
	if nonNull(c.ServiceTier) {
		a.tier = c.ServiceTier
	}
	if nonNull(c.Usage) {
		a.usage = append(json.RawMessage(nil), c.Usage...)
	}
	for _, ch := range c.Choices {
		s := a.choice(ch.Index)
		d := ch.Delta
		if d.Content != nil && *d.Content != "" {
			// An empty preamble is no content: an answer of tool calls
			// alone has content null, as OpenAI writes it.
			s.content = append(s.content, *d.Content...)
			s.hasContent = true
		}
		switch {
		case d.ReasoningContent != nil:
			s.reasoning = append(s.reasoning, *d.ReasoningContent...)
			s.reasoningKey = "reasoning_content"
		case d.Reasoning != nil:
			s.reasoning = append(s.reasoning, *d.Reasoning...)
			if s.reasoningKey == "" {
				s.reasoningKey = "reasoning"
			}
		}
		if d.Refusal != nil {
			s.refusal = append(s.refusal, *d.Refusal...)
			s.hasRefusal = true
		}
		for _, tc := range d.ToolCalls {
			t := s.tools[tc.Index]
			if t == nil {
				t = &assembledTool{}
				s.tools[tc.Index] = t
			}
			if tc.ID != "" {
				t.id = tc.ID
			}
			if tc.Type != "" {
				t.typ = tc.Type
			}
			if tc.Function.Name != "" {
				t.name += tc.Function.Name
			}
			t.args = append(t.args, tc.Function.Arguments...)
		}
		if nonNull(d.Audio) {
			s.audio = append(json.RawMessage(nil), d.Audio...)
		}
		if nonNull(ch.Logprobs) {
			var lp struct {
				Content []json.RawMessage `json:"content"`
				Refusal []json.RawMessage `json:"refusal"`
			}
			if json.Unmarshal(ch.Logprobs, &lp) == nil {
				s.logprobsContent = append(s.logprobsContent, lp.Content...)
				s.logprobsRefusal = append(s.logprobsRefusal, lp.Refusal...)
				s.hasLogprobs = true
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			f := *ch.FinishReason
			s.finish = &f
		}
	}
}

// Object returns the chat.completion's JSON.
func (a *Assembler) Object() []byte {
	b := []byte(`{"id":`)
	b = protocol.AppendJSONString(b, a.id)
	b = append(b, `,"object":"`+ObjectCompletion+`","created":`...)
	b = strconv.AppendInt(b, a.created, 10)
	b = append(b, `,"model":`...)
	b = protocol.AppendJSONString(b, a.model)
	b = append(b, `,"choices":[`...)
	idx := make([]int, 0, len(a.choices))
	for i := range a.choices {
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		idx = append(idx, 0)
		a.choice(0)
	}
	slices.Sort(idx)
	for k, i := range idx {
		if k > 0 {
			b = append(b, ',')
		}
		b = a.choices[i].append(b, i)
	}
	b = append(b, ']')
	if a.usage != nil {
		b = append(append(b, `,"usage":`...), compact(a.usage)...)
	}
	if a.fingerprint != nil {
		b = append(append(b, `,"system_fingerprint":`...), a.fingerprint...)
	}
	if a.tier != nil {
		b = append(append(b, `,"service_tier":`...), a.tier...)
	}
	return append(b, '}')
}

func (s *assembled) append(b []byte, index int) []byte {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"message":{"role":"assistant","content":`...)
	if s.hasContent || len(s.tools) == 0 {
		b = protocol.AppendJSONString(b, string(s.content))
	} else {
		b = append(b, "null"...)
	}
	if s.reasoningKey != "" {
		b = append(b, `,"`+s.reasoningKey+`":`...)
		b = protocol.AppendJSONString(b, string(s.reasoning))
	}
	b = append(b, `,"refusal":`...)
	if s.hasRefusal {
		b = protocol.AppendJSONString(b, string(s.refusal))
	} else {
		b = append(b, "null"...)
	}
	if len(s.tools) > 0 {
		b = append(b, `,"tool_calls":[`...)
		ti := make([]int, 0, len(s.tools))
		for i := range s.tools {
			ti = append(ti, i)
		}
		slices.Sort(ti)
		for k, i := range ti {
			t := s.tools[i]
			if k > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = protocol.AppendJSONString(b, t.id)
			b = append(b, `,"type":`...)
			b = protocol.AppendJSONString(b, cmpOr(t.typ, "function"))
			b = append(b, `,"function":{"name":`...)
			b = protocol.AppendJSONString(b, t.name)
			b = append(b, `,"arguments":`...)
			b = protocol.AppendJSONString(b, string(t.args))
			b = append(b, "}}"...)
		}
		b = append(b, ']')
	}
	if s.audio != nil {
		b = append(append(b, `,"audio":`...), compact(s.audio)...)
	}
	b = append(b, `},"logprobs":`...)
	if s.hasLogprobs {
		b = append(b, `{"content":`...)
		b = appendRawList(b, s.logprobsContent)
		b = append(b, `,"refusal":`...)
		b = appendRawList(b, s.logprobsRefusal)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":`...)
	if s.finish != nil {
		b = protocol.AppendJSONString(b, *s.finish)
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

func appendRawList(b []byte, list []json.RawMessage) []byte {
	if list == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, r := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, compact(r)...)
	}
	return append(b, ']')
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
