package llm

import "testing"

// BenchmarkFastChunk is what fastChunk costs per event on the three
// common shapes (a content delta, the finish, the usage), without the
// HTTP of BenchmarkOpenAIStream around it.
func BenchmarkFastChunk(b *testing.B) {
	for _, tc := range []struct{ name, event string }{
		{"content", `{"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1732000000,"model":"gpt-4o-mini","system_fingerprint":"fp_0ba0d124f1","choices":[{"index":0,"delta":{"content":" the quick brown fox"},"logprobs":null,"finish_reason":null}]}`},
		{"finish", `{"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1732000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`},
		{"usage", `{"id":"chatcmpl-abc123","object":"chat.completion.chunk","created":1732000000,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0}}}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d := []byte(tc.event)
			var ev fastEvent
			b.ReportAllocs()
			b.SetBytes(int64(len(d)))
			for b.Loop() {
				if !fastChunk(d, &ev) {
					b.Fatal("declined")
				}
			}
		})
	}
}
