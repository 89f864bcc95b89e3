package llm

import (
	"unsafe"

	"github.com/spillway-dev/spillway/internal/jsonscan"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// The fast path of the OpenAI client's stream parser (docs/bench-history/2026-11.md,
// "Per chunk: no allocation, no full decode"). Nearly every event of an
// answer is one of three shapes:
//
//	{"id":…,"object":"chat.completion.chunk",…,"choices":[{"index":0,"delta":{"content":"…"},"finish_reason":null}]}
//	{"id":…,…,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}
//	{"id":…,…,"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}
//
// and all the client needs of them is the content, the finish reason and
// the usage. fastChunk reads exactly that without encoding/json's
// reflection and allocations; anything it is not sure to read as
// encoding/json would (another shape, a field that means something to
// openAIChunk besides these, a key spelled in another case, a duplicate,
// an escaped key, deep nesting, a count that is not a plain integer) it
// declines, and the caller decodes the event in full. FuzzFastChunk holds
// it to that: for any input, what the full decoder reads, or a decline.

// fastMaxDepth bounds the nesting fastChunk skips through; deeper input
// is declined (the full decoder's own limit is far higher).
const fastMaxDepth = 32

// fastEvent is what fastChunk reads of one event. Its buffers are reused
// from one event to the next.
type fastEvent struct {
	// content is choices[0].delta.content, unescaped (empty when absent
	// or null).
	content []byte
	// finish is choices[0].finish_reason when hasFinish (a string, maybe
	// empty); hasFinish is false when it is absent or null.
	finish    []byte
	hasFinish bool
	// usage is the event's usage object when hasUsage (absent or null:
	// false).
	usage    protocol.Usage
	hasUsage bool
	// extra reports what a /v1/stream event shows besides content
	// (protocol.Chunk.Extra): a choice of another index, logprobs, a
	// refusal, audio or a function call.
	extra bool
}

// fastChunk reads event d into ev when d is a chunk of the common shapes:
// at most one choice whose delta holds at most a content string (plus
// fields the client ignores) and whose finish reason is a string or
// null; a usage object of plain integer counts or null; no error. false
// means "decode it in full": d may be of another shape, or malformed.
func fastChunk(d []byte, ev *fastEvent) bool {
	ev.content, ev.finish = ev.content[:0], ev.finish[:0]
	ev.hasFinish, ev.usage, ev.hasUsage, ev.extra = false, protocol.Usage{}, false, false
	p := fastParser{Scanner: jsonscan.Scanner{D: d}}
	p.WS()
	if !p.Eat('{') {
		return false
	}
	var seenChoices, seenUsage bool
	if !p.Object(func(key []byte) bool {
		switch {
		case string(key) == "choices" && !seenChoices:
			seenChoices = true
			return p.choices(ev)
		case string(key) == "usage" && !seenUsage:
			seenUsage = true
			if p.null() {
				return true
			}
			ev.hasUsage = true
			return p.usage(&ev.usage)
		case jsonscan.FoldsTo(key, "choices", "usage", "error"):
			// Another spelling, a duplicate, or an error object: what
			// encoding/json makes of it is the full decoder's business.
			return false
		}
		return p.skip(0)
	}) {
		return false
	}
	p.WS()
	return p.I == len(p.D)
}

// fastParser reads a chunk with the shared scanner (D at I). Every method
// reports false for input it declines, malformed input included.
type fastParser struct {
	jsonscan.Scanner
}

// null reads the literal null.
func (p *fastParser) null() bool {
	if len(p.D)-p.I >= 4 && string(p.D[p.I:p.I+4]) == "null" {
		p.I += 4
		return true
	}
	return false
}

// choices reads `[]` or `[{one choice}]` into ev.
func (p *fastParser) choices(ev *fastEvent) bool {
	if !p.Eat('[') {
		return false
	}
	if p.Eat(']') {
		return true
	}
	if !p.Eat('{') {
		return false
	}
	var seenDelta, seenFinish, seenIndex, seenLogprobs bool
	ok := p.Object(func(key []byte) bool {
		switch {
		case string(key) == "index" && !seenIndex:
			// Choice 0 without logprobs is plain; anything else is shown
			// by /v1/stream from the raw chunk.
			seenIndex = true
			start := p.I
			if !p.skip(0) {
				return false
			}
			if string(p.D[start:p.I]) != "0" {
				ev.extra = true
			}
			return true
		case string(key) == "logprobs" && !seenLogprobs:
			seenLogprobs = true
			if p.null() {
				return true
			}
			ev.extra = true
			return p.skip(0)
		case jsonscan.FoldsTo(key, "index", "logprobs"):
			return false
		case string(key) == "delta" && !seenDelta:
			seenDelta = true
			var ok bool
			ev.content, ok = p.delta(ev.content, &ev.extra)
			return ok
		case string(key) == "finish_reason" && !seenFinish:
			seenFinish = true
			if p.null() {
				return true
			}
			var ok bool
			ev.finish, ok = p.str(ev.finish)
			ev.hasFinish = ok
			return ok
		case jsonscan.FoldsTo(key, "delta", "finish_reason"):
			return false
		}
		return p.skip(0)
	})
	return ok && p.Eat(']')
}

// usage reads a usage object whose counts are plain integers; other
// members are skipped.
func (p *fastParser) usage(u *protocol.Usage) bool {
	if !p.Eat('{') {
		return false
	}
	var seenP, seenC, seenT bool
	return p.Object(func(key []byte) bool {
		switch {
		case string(key) == "prompt_tokens" && !seenP:
			seenP = true
			return p.integer(&u.PromptTokens)
		case string(key) == "completion_tokens" && !seenC:
			seenC = true
			return p.integer(&u.CompletionTokens)
		case string(key) == "total_tokens" && !seenT:
			seenT = true
			return p.integer(&u.TotalTokens)
		case string(key) == "prompt_tokens_details" || string(key) == "completion_tokens_details":
			if p.null() {
				return true
			}
			start := p.I
			if !p.skip(0) {
				return false
			}
			if key[0] == 'p' {
				u.PromptTokensDetails = protocol.RawJSON(p.D[start:p.I])
			} else {
				u.CompletionTokensDetails = protocol.RawJSON(p.D[start:p.I])
			}
			return true
		case jsonscan.FoldsTo(key, "prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "completion_tokens_details"):
			return false
		}
		return p.skip(0)
	})
}

// integer reads -?(0|[1-9][0-9]*) of at most 18 digits (so it fits an
// int whatever its sign) into n; a fraction, an exponent, null or a
// longer number is declined.
func (p *fastParser) integer(n *int) bool {
	d, i := p.D, p.I
	neg := i < len(d) && d[i] == '-'
	if neg {
		i++
	}
	start := i
	v := 0
	for i < len(d) && '0' <= d[i] && d[i] <= '9' {
		v = v*10 + int(d[i]-'0')
		i++
	}
	digits := i - start
	switch {
	case digits == 0 || digits > 18,
		digits > 1 && d[start] == '0',
		i < len(d) && (d[i] == '.' || d[i] == 'e' || d[i] == 'E'):
		return false
	}
	if neg {
		v = -v
	}
	*n, p.I = v, i
	return true
}

// delta reads a delta object: its content (a string or null), its role
// and other fields the client ignores. The reasoning fields are accepted
// only as null; tool calls not at all.
func (p *fastParser) delta(dst []byte, extra *bool) ([]byte, bool) {
	if !p.Eat('{') {
		return dst, false
	}
	var seenContent, seenRC, seenR bool
	var seenOther [3]bool // refusal, audio, function_call
	content := dst
	ok := p.Object(func(key []byte) bool {
		switch {
		case string(key) == "content" && !seenContent:
			seenContent = true
			if p.null() {
				return true
			}
			var ok bool
			content, ok = p.str(dst)
			return ok
		case string(key) == "reasoning_content" && !seenRC:
			seenRC = true
			return p.null()
		case string(key) == "reasoning" && !seenR:
			seenR = true
			return p.null()
		case jsonscan.FoldsTo(key, "content", "reasoning_content", "reasoning", "tool_calls"):
			return false
		case otherDelta(key) >= 0 && !seenOther[otherDelta(key)]:
			seenOther[otherDelta(key)] = true
			if p.null() {
				return true
			}
			*extra = true
		case jsonscan.FoldsTo(key, "refusal", "audio", "function_call"):
			return false
		}
		return p.skip(0)
	})
	return content, ok
}

// otherDelta numbers the delta members besides content and reasoning
// that /v1/stream shows: refusal 0, audio 1, function_call 2; -1 for any
// other key.
func otherDelta(key []byte) int {
	switch string(key) {
	case "refusal":
		return 0
	case "audio":
		return 1
	case "function_call":
		return 2
	}
	return -1
}

// str reads a string, appending its value to dst as encoding/json
// decodes it into a Go string.
func (p *fastParser) str(dst []byte) ([]byte, bool) {
	out, n, ok := protocol.AppendJSONUnquoted(dst, p.D[p.I:])
	p.I += n
	return out, ok
}

// skip reads any JSON value, checking its syntax as encoding/json would.
func (p *fastParser) skip(depth int) bool {
	if depth > fastMaxDepth || p.I >= len(p.D) {
		return false
	}
	switch c := p.D[p.I]; {
	case c == '{':
		p.I++
		return p.Object(func([]byte) bool { return p.skip(depth + 1) })
	case c == '[':
		p.I++
		if p.Eat(']') {
			return true
		}
		for {
			p.WS()
			if !p.skip(depth + 1) {
				return false
			}
			if p.Eat(',') {
				continue
			}
			return p.Eat(']')
		}
	case c == '"':
		return p.skipStr()
	case c == 't':
		return p.Lit("true")
	case c == 'f':
		return p.Lit("false")
	case c == 'n':
		return p.null()
	case c == '-' || ('0' <= c && c <= '9'):
		return p.Number()
	}
	return false
}

// isHex4 reports whether b starts with four hex digits.
func isHex4(b []byte) bool {
	if len(b) < 4 {
		return false
	}
	for _, c := range b[:4] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// skipStr reads a string without decoding it: any byte from 0x20 on, and
// valid escapes.
func (p *fastParser) skipStr() bool {
	for i := p.I + 1; i < len(p.D); i++ {
		switch c := p.D[i]; {
		case c == '"':
			p.I = i + 1
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if i+1 >= len(p.D) {
				return false
			}
			switch p.D[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if !isHex4(p.D[i+2:]) {
					return false
				}
				i += 5
			default:
				return false
			}
		}
	}
	return false
}

// slabString returns b as a string carved from the end of slab, which it
// grows (a new block, never overwriting the old one) when b does not fit:
// one allocation per block instead of one per chunk. A block is never
// written again once a string points into it, so the strings stay
// immutable; a block lives as long as any of its strings.
func slabString(slab *[]byte, b []byte) string {
	if len(b) == 0 {
		return ""
	}
	s := *slab
	if cap(s)-len(s) < len(b) {
		size := min(max(2*cap(s), slabMin), slabMax)
		s = make([]byte, 0, max(size, len(b)))
	}
	start := len(s)
	s = append(s, b...)
	*slab = s
	return unsafe.String(&s[start], len(b))
}

// Block sizes of slabString: small for short answers, doubling to a
// bound for long ones.
const (
	slabMin = 256
	slabMax = 4 << 10
)
