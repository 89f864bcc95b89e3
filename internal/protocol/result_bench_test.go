package protocol

import (
	"fmt"
	"testing"
)

// BenchmarkBatchCodec encodes and decodes BATCH messages of 5 and 20
// chunks as a worker writes and the api's relay reads them: the per
// message cost of the queued path's relay (docs/bench-history/2026-11.md, "Queued
// relay").
func BenchmarkBatchCodec(b *testing.B) {
	for _, n := range []int{5, 20} {
		chunks := make([]Chunk, n)
		for i := range chunks {
			chunks[i] = Chunk{Seq: 100 + i, Content: fmt.Sprintf(" word%d, \"quoted\" <tag>\n", i)}
		}
		r := Result{Kind: KindBatch, Attempt: 2, Chunks: chunks}
		msg, err := EncodeResult(r)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("encode/chunks=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := EncodeResult(r); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("decode/chunks=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeResult(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
