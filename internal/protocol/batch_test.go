package protocol

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

var batchSamples = [][]Chunk{
	{{Seq: 1, Content: "Hel"}},
	{{Seq: 7, Content: "lo"}, {Seq: 8, Content: " <b>&amp;</b>\n"}, {Seq: 9, Content: "é 日本 🎉 \u2028"}, {Seq: 10, Content: ""}},
	{{Seq: 999999999, Content: "bad \xff utf8 \"q\" \\ \x00\x1f"}},
}

// encodingJSONBatch is the BATCH payload as encoding/json writes it.
func encodingJSONBatch(tb testing.TB, chunks []Chunk) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(chunks); err != nil {
		tb.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func TestBatchCodecMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, chunks := range batchSamples {
		want := encodingJSONBatch(t, chunks)
		got := appendBatch(nil, chunks)
		if !bytes.Equal(got, want) {
			t.Errorf("appendBatch = %s, encoding/json %s", got, want)
		}
		dec, ok := decodeBatchFast(got)
		var full []Chunk
		if err := json.Unmarshal(got, &full); err != nil {
			t.Fatal(err)
		}
		if !ok || !reflect.DeepEqual(dec, full) {
			t.Errorf("decodeBatchFast(%s) = %+v, %v; want %+v, true", got, dec, ok, full)
		}
	}
	for _, s := range []string{
		`[{"seq":1, "content":"x"}]`, `[{"content":"x","seq":1}]`, `[{"seq":1.0,"content":"x"}]`,
		`[{"seq":01,"content":"x"}]`, `[{"seq":1,"content":"x"}] `, `[{"seq":1,"content":"x"},]`,
		`[{"seq":1,"content":"x","extra":1}]`, `[{"Seq":1,"content":"x"}]`, `[{"seq":1234567890123456789,"content":"x"}]`,
	} {
		if c, ok := decodeBatchFast([]byte(s)); ok {
			t.Errorf("decodeBatchFast(%s) = %+v, accepted; want declined", s, c)
		}
	}
}

// Not parallel: AllocsPerRun counts the whole process.
func TestDecodeBatchAllocations(t *testing.T) {
	msg, err := EncodeResult(Result{Kind: KindBatch, Attempt: 3, Chunks: batchSamples[1]})
	if err != nil {
		t.Fatal(err)
	}
	// The chunk slice and one string holding every content.
	if n := testing.AllocsPerRun(100, func() {
		if _, err := DecodeResult(msg); err != nil {
			t.Fatal(err)
		}
	}); n > 2 {
		t.Errorf("DecodeResult of a batch of %d chunks: %v allocations, want at most 2", len(batchSamples[1]), n)
	}
}

// FuzzBatchCodec holds the BATCH fast paths to encoding/json: the decoder
// reads what encoding/json reads or declines, and the encoder writes what
// encoding/json writes.
func FuzzBatchCodec(f *testing.F) {
	for _, chunks := range batchSamples {
		f.Add(appendBatch(nil, chunks))
	}
	f.Add([]byte(`[]`))
	f.Add([]byte(`[{"seq":-0,"content":"\ud83c\udf89\ud800x"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, ok := decodeBatchFast(b); ok {
			var want []Chunk
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatalf("fast path accepted %q, which encoding/json refuses: %v", b, err)
			}
			if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("fast path read %+v from %q; encoding/json %+v", got, b, want)
			}
		}
		var chunks []Chunk
		if json.Unmarshal(b, &chunks) == nil {
			if got, want := appendBatch(nil, chunks), encodingJSONBatch(t, chunks); !bytes.Equal(got, want) {
				t.Fatalf("appendBatch(%+v) = %s, encoding/json %s", chunks, got, want)
			}
		}
	})
}
