package protocol

import (
	"encoding/binary"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/jsonscan"
)

// The one-pass reader of a chat request body (docs/bench-history/2026-11.md,
// "Decoding a request in one pass"). encoding/json scans a value again for
// every Unmarshal on the way down (the body, the messages, each message,
// each content part), so a 1 MiB base64 image was scanned about ten times.
// readChatFast walks the body once, checking its syntax as encoding/json
// would, and reads exactly what decodeChat needs: the top-level members it
// checks, as rawRequest holds them, and the messages' text view. Anything
// it is not sure to read as encoding/json and the checks of readBody and
// readMessages would (a key spelled in another case or escaped, a
// duplicate, a value of an unexpected type, a NUL, invalid UTF-8, nesting
// deeper than maxDepth, any error) it declines, and decodeChat takes the
// full path, so every error text stays the full path's.
// FuzzDecodeChatFast holds it to that: for any body, the same request and
// error as the full path.

// fastChat is what readChatFast read of a body.
type fastChat struct {
	raw rawRequest
	// msgs is the text view of messages when it is an array (read is
	// set); TextBytes and NonTextParts count over it.
	msgs               []Message
	read               bool
	textBytes, nonText int
	// threadKey: a top-level member spelled exactly thread_id was seen
	// (nativeBody takes it out, even when null).
	threadKey bool
}

// readChatFast reads body in one pass when it can (see above); false
// means "take the full path". Messages beyond maxMessages are declined.
func readChatFast(body []byte, maxMessages int) (fastChat, bool) {
	var f fastChat
	if !utf8.Valid(body) {
		return f, false
	}
	p := reqParser{Scanner: jsonscan.Scanner{D: body}, depth: 1}
	p.WS()
	if !p.Eat('{') {
		return f, false
	}
	var seen [12]bool
	ok := p.Object(func(key []byte) bool {
		k := chatKey(key)
		if k < 0 {
			if jsonscan.FoldsTo(key, chatKeys[:]...) {
				return false // another spelling: encoding/json would read it
			}
			return p.skip()
		}
		if seen[k] {
			return false // a duplicate: the last one wins in encoding/json
		}
		seen[k] = true
		start := p.I
		if k == keyMessages && p.I < len(p.D) && p.D[p.I] == '[' {
			if !p.messages(&f, maxMessages) {
				return false
			}
		} else if !p.skip() {
			return false
		}
		v := p.D[start:p.I]
		switch k {
		case keyModel:
			f.raw.Model = v
		case keyTemperature:
			f.raw.Temperature = v
		case keyN:
			f.raw.N = v
		case keyStream:
			f.raw.Stream = v
		case keyMessages:
			f.raw.Messages = v
		case keyPrompt:
			f.raw.Prompt = v
		case keyMaxTokens:
			f.raw.MaxTokens = v
		case keyMaxCompletionTokens:
			f.raw.MaxCompletionTokens = v
		case keyStreamOptions:
			f.raw.StreamOptions = v
		case keyThreadID:
			f.raw.ThreadID = v
			f.threadKey = true
		case keyTools:
			f.raw.Tools = v
		case keyReasoningEffort:
			f.raw.ReasoningEffort = v
		}
		return true
	})
	if !ok {
		return f, false
	}
	p.WS()
	if p.I != len(p.D) {
		return f, false
	}
	if !f.read && !isNull(f.raw.Messages) {
		return f, false // messages of another type: the full path says so
	}
	return f, true
}

// The top-level members of a chat request, in rawRequest's order.
const (
	keyModel = iota
	keyTemperature
	keyN
	keyStream
	keyMessages
	keyPrompt
	keyMaxTokens
	keyMaxCompletionTokens
	keyStreamOptions
	keyThreadID
	keyTools
	keyReasoningEffort
)

var chatKeys = [12]string{"model", "temperature", "n", "stream", "messages", "prompt", "max_tokens",
	"max_completion_tokens", "stream_options", "thread_id", "tools", "reasoning_effort"}

// chatKey is the index of key in chatKeys, or -1.
func chatKey(key []byte) int {
	for k, name := range chatKeys {
		if string(key) == name {
			return k
		}
	}
	return -1
}

// messages reads the messages array into f: each an object with a role of
// roles and a content of null, a string or an array of parts, at most
// max of them.
func (p *reqParser) messages(f *fastChat, max int) bool {
	p.I++ // '['
	p.depth++
	if p.depth > maxDepth {
		return false
	}
	if p.Eat(']') {
		return false // empty: the full path refuses it
	}
	for {
		if len(f.msgs) >= max {
			return false
		}
		p.WS()
		if !p.Eat('{') {
			return false
		}
		m, ok := p.message(f)
		if !ok {
			return false
		}
		f.msgs = append(f.msgs, m)
		if p.Eat(',') {
			continue
		}
		if !p.Eat(']') {
			return false
		}
		p.depth--
		f.read = true
		return true
	}
}

// message reads one message object whose '{' was consumed.
func (p *reqParser) message(f *fastChat) (Message, bool) {
	p.depth++
	if p.depth > maxDepth {
		return Message{}, false
	}
	var m Message
	var seenRole, seenContent bool
	ok := p.Object(func(key []byte) bool {
		switch {
		case string(key) == "role" && !seenRole:
			seenRole = true
			role, ok := p.str()
			if !ok || !roles[role] {
				return false
			}
			m.Role = role
			return true
		case string(key) == "content" && !seenContent:
			seenContent = true
			return p.content(f, &m)
		case jsonscan.FoldsTo(key, "role", "content"):
			return false
		}
		return p.skip()
	})
	p.depth--
	return m, ok && seenRole
}

// content reads a message's content: null, a string, or an array of
// parts whose text parts are joined by line breaks (readContent).
func (p *reqParser) content(f *fastChat, m *Message) bool {
	if p.I >= len(p.D) {
		return false
	}
	switch p.D[p.I] {
	case 'n':
		return p.Lit("null")
	case '"':
		s, ok := p.str()
		f.textBytes += len(s)
		m.Content = s
		return ok
	case '[':
	default:
		return false
	}
	p.I++
	p.depth++
	if p.depth > maxDepth {
		return false
	}
	var texts []string
	if !p.Eat(']') {
		for {
			p.WS()
			if !p.Eat('{') {
				return false
			}
			text, isText, ok := p.part()
			if !ok {
				return false
			}
			if isText {
				texts = append(texts, text)
				f.textBytes += len(text)
			} else {
				f.nonText++
			}
			if p.Eat(',') {
				continue
			}
			if !p.Eat(']') {
				return false
			}
			break
		}
	}
	p.depth--
	switch len(texts) {
	case 0:
	case 1:
		m.Content = texts[0]
	default:
		n := len(texts) - 1
		for _, t := range texts {
			n += len(t)
		}
		b := make([]byte, 0, n)
		for i, t := range texts {
			if i > 0 {
				b = append(b, '\n')
			}
			b = append(b, t...)
		}
		m.Content = string(b)
	}
	return true
}

// part reads one content part whose '{' was consumed: a text part
// ("text", "input_text", "output_text" with a string text) gives its text,
// any other counts as a part that is not text. The rest of the part (an
// image's base64 URL) is skipped.
func (p *reqParser) part() (text string, isText, ok bool) {
	p.depth++
	if p.depth > maxDepth {
		return "", false, false
	}
	var typ string
	var textAt = -1
	var seenType bool
	ok = p.Object(func(key []byte) bool {
		switch {
		case string(key) == "type" && !seenType:
			seenType = true
			var ok bool
			typ, ok = p.str()
			return ok
		case string(key) == "text" && textAt < 0:
			if p.I >= len(p.D) || p.D[p.I] != '"' {
				// null gives "", another type no text: the full path
				// tells them apart.
				return false
			}
			textAt = p.I
			return p.skip()
		case jsonscan.FoldsTo(key, "type", "text"):
			return false
		}
		return p.skip()
	})
	p.depth--
	if !ok {
		return "", false, false
	}
	if typ != "text" && typ != "input_text" && typ != "output_text" || textAt < 0 {
		return "", false, true
	}
	q := reqParser{Scanner: jsonscan.Scanner{D: p.D, I: textAt}}
	text, ok = q.str()
	return text, true, ok
}

// reqParser reads a body with the shared scanner (D at I), at nesting
// depth (the body's object is 1). Every method reports false for input it declines, malformed
// input included.
type reqParser struct {
	jsonscan.Scanner
	depth int
}

// str reads a string value as encoding/json decodes it into a Go string.
func (p *reqParser) str() (string, bool) {
	start := p.I
	if start >= len(p.D) || p.D[start] != '"' {
		return "", false
	}
	end, esc, ok := strEnd(p.D, p.I)
	if !ok {
		return "", false
	}
	p.I = end
	if !esc {
		return string(p.D[start+1 : end-1]), true
	}
	out, _, ok := AppendJSONUnquoted(nil, p.D[start:end])
	return string(out), ok
}

// skip reads any JSON value, checking its syntax as encoding/json would.
func (p *reqParser) skip() bool {
	if p.I >= len(p.D) {
		return false
	}
	switch c := p.D[p.I]; {
	case c == '"':
		end, _, ok := strEnd(p.D, p.I)
		p.I = end
		return ok
	case c == '{':
		p.I++
		p.depth++
		if p.depth > maxDepth {
			return false
		}
		ok := p.Object(func([]byte) bool { return p.skip() })
		p.depth--
		return ok
	case c == '[':
		p.I++
		p.depth++
		if p.depth > maxDepth {
			return false
		}
		ok := p.array()
		p.depth--
		return ok
	case c == 't':
		return p.Lit("true")
	case c == 'f':
		return p.Lit("false")
	case c == 'n':
		return p.Lit("null")
	case c == '-' || ('0' <= c && c <= '9'):
		return p.Number()
	}
	return false
}

// array reads the values of an array whose '[' was consumed.
func (p *reqParser) array() bool {
	if p.Eat(']') {
		return true
	}
	for {
		p.WS()
		if !p.skip() {
			return false
		}
		if p.Eat(',') {
			continue
		}
		return p.Eat(']')
	}
}

// strEnd returns the index after the JSON string whose opening quote is
// at d[i], and whether it holds escapes. ok is false for a string
// encoding/json refuses (a control character, a bad escape, no end) and
// for one holding the escape \u0000 (a NUL, which the full path refuses
// with its own error). Eight bytes are looked at a time while none of
// them is a quote, a backslash or a control character: the long base64
// strings of inline images cost a fraction of a byte-by-byte scan.
func strEnd(d []byte, i int) (end int, esc, ok bool) {
	const (
		ones   = 0x0101010101010101
		highs  = 0x8080808080808080
		quotes = '"' * ones
		slashs = '\\' * ones
	)
	j := i + 1
	for {
		for j+8 <= len(d) {
			x := binary.LittleEndian.Uint64(d[j:])
			q, s := x^quotes, x^slashs
			// Whether any byte is under 0x20, and whether q (a quote) or
			// s (a backslash) has a zero byte: exact as to whether any
			// is, not as to which.
			if (x-0x20*ones)&^x&highs|(q-ones)&^q&highs|(s-ones)&^s&highs != 0 {
				break
			}
			j += 8
		}
		if j >= len(d) {
			return 0, false, false
		}
		switch c := d[j]; {
		case c == '"':
			return j + 1, esc, true
		case c < 0x20:
			return 0, false, false
		case c == '\\':
			esc = true
			if j+1 >= len(d) {
				return 0, false, false
			}
			switch d[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j += 2
			case 'u':
				if hex4(d[j+2:]) <= 0 {
					return 0, false, false // not four hex digits, or \u0000
				}
				j += 6
			default:
				return 0, false, false
			}
		default:
			j++
		}
	}
}
