package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// fullChunk is what the full decoder makes of event d, as dispatch uses
// it: the content emitted, the finish reason and usage, and whether
// anything else in d (reasoning, tool calls, an error) matters to the
// client.
func fullChunk(d []byte) (ev fastEvent, other bool, err error) {
	var ch openAIChunk
	if err := json.Unmarshal(d, &ch); err != nil {
		return ev, false, err
	}
	other = ch.Error != nil
	if ch.Usage != nil {
		ev.usage, ev.hasUsage = *ch.Usage, true
	}
	if len(ch.Choices) > 0 {
		cc := ch.Choices[0]
		ev.content = []byte(cc.Delta.Content)
		if cc.FinishReason != nil {
			ev.finish, ev.hasFinish = []byte(*cc.FinishReason), true
		}
		other = other || cc.Delta.ReasoningContent != "" || cc.Delta.Reasoning != "" ||
			len(cc.Delta.ToolCalls) > 0
	}
	return ev, other, nil
}

// sameEvent reports whether the fast and the full reading agree.
func sameEvent(a, b fastEvent) bool {
	return string(a.content) == string(b.content) && a.hasFinish == b.hasFinish &&
		string(a.finish) == string(b.finish) && a.hasUsage == b.hasUsage && a.usage == b.usage
}

// wireSamples are chunks as servers send them: our own encoder (what
// simllm and the api's OpenAI endpoint write), OpenAI's, vLLM's,
// llama.cpp's and Ollama's shapes, and the edge cases of the fast path.
func wireSamples() []string {
	enc := openaiwire.NewChunkEncoder("req-1", "sim-1", 1700000000)
	own := func(b []byte) string { return strings.TrimSuffix(strings.TrimPrefix(string(b), "data: "), "\n\n") }
	return []string{
		own(enc.AppendContent(nil, "Hello", true)),
		own(enc.AppendContent(nil, " world", false)),
		own(enc.AppendContent(nil, "line\nbreak \"quoted\" <tag> & \u2028 é 日本 🎉", false)),
		own(enc.AppendFinish(nil, "stop")),
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`,
		`{"id":"cmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
		`{"id":"cmpl-1","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}`,
		`{"id":"cmpl-1","choices":[{"index":0,"delta":{"content":"x","reasoning_content":null},"finish_reason":null}]}`,
		`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hi"}}],"created":1,"id":"chatcmpl-x","model":"llama","object":"chat.completion.chunk"}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"llama3","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}`,
		`{"error":{"message":"overloaded"}}`,
		`{"error":null,"choices":[{"delta":{"content":"a"}}]}`,
		`{"Choices":[{"delta":{"content":"case"}}]}`,
		`{"choices":[{"Delta":{"content":"case"}}]}`,
		`{"choices":[{"delta":{"CONTENT":"case"}}]}`,
		`{"choices":[{"delta":{"content":"a","content":"b"}}]}`,
		`{"choices":[{"delta":{"content":"a"}}],"choices":[]}`,
		`{"\u0063hoices":[{"delta":{"content":"escaped key"}}]}`,
		`{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}`,
		`{"choices":[{"delta":{"content":"\ud83c\udf89 \ud800 \udc00x \u00e9\/\b\f\r\t"}}]}`,
		"{\"choices\":[{\"delta\":{\"content\":\"bad \xff utf8 \xed\xa0\x80\"}}]}",
		`{"choices":[{"delta":{"content":"a"}}]} trailing`,
		`{"choices":[{"delta":{"content":"a"}}],}`,
		`{"choices":[{"delta":{"content":"a"}}],"n":01}`,
		`{"choices":[{"delta":{"content":"a"}}],"n":-1.5e+3,"t":true,"f":false,"z":null,"o":{"a":[1,{"b":[]}]}}`,
		` { "choices" : [ { "delta" : { "content" : "spaced" } , "finish_reason" : null } ] } `,
		`{"choices":[{"delta":{"content":null}}]}`,
		`{"choices":[{"delta":{"content":"a"},"finish_reason":"length"}]}`,
		`{"choices":null}`,
		`{"choices":[null]}`,
		`{"choices":[{"delta":null}]}`,
		`{"choices":[{"delta":{"content":5}}]}`,
		`{"choices":[{"delta":{},"finish_reason":""}]}`,
		`{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"choices":[{"delta":{},"finish_reason":"st\u006fp"}]}`,
		`{"choices":[{"delta":{},"finish_reason":5}]}`,
		`{"choices":[{"delta":{},"finish_reason":"stop","finish_reason":null}]}`,
		`{"choices":[{"delta":{},"Finish_Reason":"stop"}]}`,
		`{"choices":[],"usage":{}}`,
		`{"choices":[],"usage":{"prompt_tokens":-0,"completion_tokens":-7,"total_tokens":999999999999999999}}`,
		`{"choices":[],"usage":{"prompt_tokens":9223372036854775808}}`,
		`{"choices":[],"usage":{"prompt_tokens":1.0}}`,
		`{"choices":[],"usage":{"prompt_tokens":1e2}}`,
		`{"choices":[],"usage":{"prompt_tokens":01}}`,
		`{"choices":[],"usage":{"prompt_tokens":null}}`,
		`{"choices":[],"usage":{"prompt_tokens":"5"}}`,
		`{"choices":[],"usage":{"prompt_tokens":1,"prompt_tokens":2}}`,
		`{"choices":[],"usage":{"Prompt_Tokens":1}}`,
		`{"choices":[],"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`,
		`{"choices":[],"usage":[]}`,
		`{"choices":[],"usage":{"total_tokens":3},"usage":null}`,
		`[]`,
		``,
	}
}

func TestFastChunkCommonShapes(t *testing.T) {
	t.Parallel()
	enc := openaiwire.NewChunkEncoder("req-1", "sim-1", 1700000000)
	trim := func(b []byte) []byte {
		return bytes.TrimSuffix(bytes.TrimPrefix(b, []byte("data: ")), []byte("\n\n"))
	}
	var ev fastEvent
	for _, content := range []string{"Hello", " world", "", "a\nb \"q\" \\ <&> \u2028 é 🎉"} {
		d := trim(enc.AppendContent(nil, content, content == "Hello"))
		if !fastChunk(d, &ev) || string(ev.content) != content || ev.hasFinish || ev.hasUsage {
			t.Errorf("fastChunk(%s) = %+v; want content %q only", d, ev, content)
		}
	}
	if d := trim(enc.AppendFinish(nil, "length")); !fastChunk(d, &ev) || string(ev.finish) != "length" || !ev.hasFinish || len(ev.content) != 0 {
		t.Errorf("fastChunk(%s) = %+v; want finish reason length", d, ev)
	}
	// OpenAI's own first, middle and usage chunks take the fast path too.
	for _, s := range wireSamples()[4:7] {
		if !fastChunk([]byte(s), &ev) {
			t.Errorf("fastChunk declined OpenAI's chunk %s", s)
		}
	}
	if want := (protocol.Usage{PromptTokens: 9, CompletionTokens: 12, TotalTokens: 21}); !ev.hasUsage || ev.usage != want {
		t.Errorf("usage chunk read as %+v; want %+v", ev, want)
	}
	// Declined: what means more than content, finish and usage, and what
	// encoding/json might read otherwise.
	for _, s := range []string{
		`{"choices":[{"delta":{"reasoning_content":"hmm"}}]}`,
		`{"choices":[{"delta":{"tool_calls":[]}}]}`,
		`{"choices":[],"usage":{"prompt_tokens":1.0}}`,
		`{"choices":[],"usage":{"Prompt_Tokens":1}}`,
		`{"error":{"message":"x"}}`,
		`{"Choices":[{"delta":{"content":"case"}}]}`,
		`{"choices":[{"delta":{"content":"a","content":"b"}}]}`,
		`{"\u0063hoices":[]}`,
		`{"choices":[{"delta":{"content":"a"}}]}x`,
	} {
		if fastChunk([]byte(s), &ev) {
			t.Errorf("fastChunk(%s) = %+v, accepted; want declined", s, ev)
		}
	}
}

// FuzzFastChunk checks the fast path against the full decoder: for any
// event, the same content, finish reason and usage with nothing else in
// it that matters, or a decline.
func FuzzFastChunk(f *testing.F) {
	for _, s := range wireSamples() {
		f.Add([]byte(s))
	}
	var got fastEvent // reused, as the client does
	f.Fuzz(func(t *testing.T, d []byte) {
		if !fastChunk(d, &got) {
			return
		}
		want, other, err := fullChunk(d)
		if err != nil {
			t.Fatalf("fast path accepted %q, which the full decoder refuses: %v", d, err)
		}
		if other {
			t.Fatalf("fast path accepted %q, which carries more than content, finish and usage", d)
		}
		if !sameEvent(got, want) {
			t.Fatalf("fast path read %+v from %q; the full decoder %+v", got, d, want)
		}
	})
}

func TestSlabString(t *testing.T) {
	t.Parallel()
	var slab []byte
	var got []string
	var want []string
	buf := make([]byte, 0, 64)
	for i := range 2000 {
		buf = fmt.Appendf(buf[:0], "chunk %d;", i)
		got = append(got, slabString(&slab, buf))
		want = append(want, string(buf))
		buf[0] = 'X' // the caller reuses its buffer: the strings must not change
	}
	big := bytes.Repeat([]byte("b"), 3*slabMax)
	got, want = append(got, slabString(&slab, big)), append(want, string(big))
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("string %d = %q, want %q", i, got[i], want[i])
		}
	}
	if s := slabString(&slab, nil); s != "" {
		t.Errorf("empty input gave %q", s)
	}
}

// sseBody is an answer of n chunks in our encoder's shape.
func sseBody(n int) []byte {
	enc := openaiwire.NewChunkEncoder("req-1", "sim-1", 1700000000)
	var b []byte
	for i := range n {
		b = enc.AppendContent(b, fmt.Sprintf(" tok%d", i), i == 0)
	}
	b = enc.AppendFinish(b, "stop")
	return append(b, openaiwire.DoneFrame...)
}

// TestReadAllocationsDoNotGrowWithChunks: reading an answer allocates per
// answer (the read buffer, a few string blocks), not per chunk.
// Not parallel: AllocsPerRun counts the whole process's allocations.
func TestReadAllocationsDoNotGrowWithChunks(t *testing.T) {
	o := &OpenAI{firstToken: time.Minute, idle: time.Minute}
	allocs := func(n int) float64 {
		body := sseBody(n)
		var emitted int
		r := bytes.NewReader(body)
		return testing.AllocsPerRun(20, func() {
			r.Reset(body)
			emitted = 0
			c := &openAICall{o: o, ctx: context.Background(), callCtx: context.Background(),
				emit: func(c protocol.Chunk) error {
					if c.Content != "" {
						emitted++
					}
					return nil
				}, timer: time.NewTimer(time.Hour),
				span: trace.SpanFromContext(context.Background())}
			if _, err := c.read(r); err != nil || emitted != n {
				t.Fatalf("read %d chunks: emitted %d, err %v", n, emitted, err)
			}
		})
	}
	few, many := allocs(10), allocs(1000)
	// 990 more chunks of about 8 bytes: a handful of 4 KiB string blocks.
	if many-few > 8 {
		t.Errorf("allocations per answer: %v for 10 chunks, %v for 1000: they grow with the chunks", few, many)
	}
}
