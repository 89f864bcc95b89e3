package protocol

import (
	"strconv"
	"unsafe"
)

// The BATCH payload, `[{"seq":1,"content":"…"},…]`, is most of what the
// result channel carries; these read and write it without encoding/json's
// reflection (docs/bench-history/2026-11.md, "Queued relay"). The encoder writes
// byte for byte what json.Encoder with SetEscapeHTML(false) writes; the
// decoder accepts exactly that shape and declines anything else, which
// decodeResult then decodes in full. FuzzBatchCodec holds both to
// encoding/json.

// appendBatch appends chunks as the JSON array of a BATCH message.
func appendBatch(dst []byte, chunks []Chunk) []byte {
	dst = append(dst, '[')
	for i, c := range chunks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"seq":`...)
		dst = strconv.AppendInt(dst, int64(c.Seq), 10)
		dst = append(dst, `,"content":`...)
		dst = appendJSONString(dst, c.Content, false)
		if c.Raw != nil {
			dst = append(dst, `,"raw":`...)
			dst = append(dst, c.Raw...)
		}
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// batchLen is about the length of a BATCH message of chunks, so it is
// written into one allocation (more only for content that needs escaping).
func batchLen(chunks []Chunk) int {
	n := len("BATCH:999999999:[]")
	for _, c := range chunks {
		n += len(`{"seq":,"content":"","raw":},`) + 10 + len(c.Content) + len(c.Content)/8 + len(c.Raw)
	}
	return n
}

// decodeBatchFast reads a BATCH array in the shape appendBatch writes.
// Every content is a substring of one string, so a batch costs two
// allocations whatever its length (up to 16 chunks, three beyond). ok false means "decode it in full".
func decodeBatchFast(b []byte) (chunks []Chunk, ok bool) {
	const (
		open = `{"seq":`
		mid  = `,"content":`
	)
	if len(b) < 2 || b[0] != '[' {
		return nil, false
	}
	type span struct{ seq, from, to int }
	var (
		spans [16]span
		list  = spans[:0]
		// Unescaped text is no longer than the JSON, but for invalid
		// UTF-8, which grows and is rare.
		text = make([]byte, 0, len(b))
	)
	i := 1
	if b[i] == ']' {
		return nil, i+1 == len(b)
	}
	for {
		if len(b)-i < len(open) || string(b[i:i+len(open)]) != open {
			return nil, false
		}
		i += len(open)
		seq, n, ok := smallInt(b[i:])
		if !ok {
			return nil, false
		}
		i += n
		if len(b)-i < len(mid) || string(b[i:i+len(mid)]) != mid {
			return nil, false
		}
		i += len(mid)
		from := len(text)
		text, n, ok = AppendJSONUnquoted(text, b[i:])
		if !ok {
			return nil, false
		}
		i += n
		list = append(list, span{seq, from, len(text)})
		if i+1 >= len(b) || b[i] != '}' {
			return nil, false
		}
		i++
		if b[i] == ',' {
			i++
			continue
		}
		if b[i] != ']' || i+1 != len(b) {
			return nil, false
		}
		break
	}
	// text is never written again: its bytes become the contents'
	// string without a copy.
	all := unsafe.String(unsafe.SliceData(text), len(text))
	chunks = make([]Chunk, len(list))
	for k, s := range list {
		chunks[k] = Chunk{Seq: s.seq, Content: all[s.from:s.to]}
	}
	return chunks, true
}

// smallInt reads a JSON integer of at most 18 digits (so it fits an int
// on every platform Go runs this on without overflow checks): -?(0|[1-9][0-9]*).
func smallInt(b []byte) (v, n int, ok bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		n = 1
	}
	start := n
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		v = v*10 + int(b[n]-'0')
		n++
	}
	digits := n - start
	if digits == 0 || digits > 18 || (digits > 1 && b[start] == '0') {
		return 0, 0, false
	}
	if neg {
		v = -v
	}
	return v, n, true
}
