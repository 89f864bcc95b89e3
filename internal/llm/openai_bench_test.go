package llm_test

import (
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// BenchmarkOpenAIStream measures one whole stream of 48 chunks through the
// OpenAI client and simserver over loopback HTTP, with the simulator's
// delays set to zero: the per-stream cost of client plus server.
func BenchmarkOpenAIStream(b *testing.B) {
	_, hs := startSimServer(b, llm.SimConfig{Tokens: 48, Seed: 1})
	c := newClient(b, llm.OpenAIConfig{BaseURL: hs.URL + "/v1", Timeout: time.Minute})
	req := userReq("benchmark the stream")
	emit := func(protocol.Chunk) error { return nil }
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Stream(b.Context(), req, emit); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.Stream(b.Context(), req, emit); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
