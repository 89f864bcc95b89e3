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
)

// fullDelta is what the full decoder makes of event d, as dispatch uses
// it: the content emitted, and whether anything else in d (a finish
// reason, usage, reasoning, tool calls, an error) matters to the client.
func fullDelta(d []byte) (content string, other bool, err error) {
	var ch openAIChunk
	if err := json.Unmarshal(d, &ch); err != nil {
		return "", false, err
	}
	other = ch.Error != nil || ch.Usage != nil
	if len(ch.Choices) > 0 {
		cc := ch.Choices[0]
		content = cc.Delta.Content
		other = other || cc.Delta.ReasoningContent != "" || cc.Delta.Reasoning != "" ||
			len(cc.Delta.ToolCalls) > 0 || cc.FinishReason != nil
	}
	return content, other, nil
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
		`[]`,
		``,
	}
}

func TestFastDeltaCommonShapes(t *testing.T) {
	t.Parallel()
	enc := openaiwire.NewChunkEncoder("req-1", "sim-1", 1700000000)
	for _, content := range []string{"Hello", " world", "", "a\nb \"q\" \\ <&> \u2028 é 🎉"} {
		ev := bytes.TrimSuffix(bytes.TrimPrefix(enc.AppendContent(nil, content, content == "Hello"), []byte("data: ")), []byte("\n\n"))
		got, ok := fastDelta(ev, nil)
		if !ok || string(got) != content {
			t.Errorf("fastDelta(%s) = %q, %v; want %q, true", ev, got, ok, content)
		}
	}
	// OpenAI's own first and middle chunks take the fast path too.
	for _, s := range wireSamples()[4:6] {
		if _, ok := fastDelta([]byte(s), nil); !ok {
			t.Errorf("fastDelta declined OpenAI's chunk %s", s)
		}
	}
	// Declined: what means more than content, and what encoding/json
	// might read otherwise.
	for _, s := range []string{
		`{"choices":[{"delta":{},"finish_reason":"stop"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":1}}`,
		`{"choices":[{"delta":{"reasoning_content":"hmm"}}]}`,
		`{"choices":[{"delta":{"tool_calls":[]}}]}`,
		`{"error":{"message":"x"}}`,
		`{"Choices":[{"delta":{"content":"case"}}]}`,
		`{"choices":[{"delta":{"content":"a","content":"b"}}]}`,
		`{"\u0063hoices":[]}`,
		`{"choices":[{"delta":{"content":"a"}}]}x`,
	} {
		if got, ok := fastDelta([]byte(s), nil); ok {
			t.Errorf("fastDelta(%s) = %q, accepted; want declined", s, got)
		}
	}
}

// FuzzFastDelta checks the fast path against the full decoder: for any
// event, the same content with nothing else in it that matters, or a
// decline.
func FuzzFastDelta(f *testing.F) {
	for _, s := range wireSamples() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		got, ok := fastDelta(d, nil)
		if !ok {
			return
		}
		want, other, err := fullDelta(d)
		if err != nil {
			t.Fatalf("fast path accepted %q, which the full decoder refuses: %v", d, err)
		}
		if other {
			t.Fatalf("fast path accepted %q, which carries more than content", d)
		}
		if string(got) != want {
			t.Fatalf("fast path read %q from %q; the full decoder %q", got, d, want)
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
				emit: func(string) error { emitted++; return nil }, timer: time.NewTimer(time.Hour),
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
