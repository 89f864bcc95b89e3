package protocol

import (
	"encoding/binary"
	"unicode/utf8"
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
	p := reqParser{d: body, depth: 1}
	p.ws()
	if !p.eat('{') {
		return f, false
	}
	var seen [12]bool
	ok := p.object(func(key []byte) bool {
		k := chatKey(key)
		if k < 0 {
			if foldsTo(key, chatKeys[:]...) {
				return false // another spelling: encoding/json would read it
			}
			return p.skip()
		}
		if seen[k] {
			return false // a duplicate: the last one wins in encoding/json
		}
		seen[k] = true
		start := p.i
		if k == keyMessages && p.i < len(p.d) && p.d[p.i] == '[' {
			if !p.messages(&f, maxMessages) {
				return false
			}
		} else if !p.skip() {
			return false
		}
		v := p.d[start:p.i]
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
	p.ws()
	if p.i != len(p.d) {
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
	p.i++ // '['
	p.depth++
	if p.depth > maxDepth {
		return false
	}
	if p.eat(']') {
		return false // empty: the full path refuses it
	}
	for {
		if len(f.msgs) >= max {
			return false
		}
		p.ws()
		if !p.eat('{') {
			return false
		}
		m, ok := p.message(f)
		if !ok {
			return false
		}
		f.msgs = append(f.msgs, m)
		if p.eat(',') {
			continue
		}
		if !p.eat(']') {
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
	ok := p.object(func(key []byte) bool {
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
		case foldsTo(key, "role", "content"):
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
	if p.i >= len(p.d) {
		return false
	}
	switch p.d[p.i] {
	case 'n':
		return p.lit("null")
	case '"':
		s, ok := p.str()
		f.textBytes += len(s)
		m.Content = s
		return ok
	case '[':
	default:
		return false
	}
	p.i++
	p.depth++
	if p.depth > maxDepth {
		return false
	}
	var texts []string
	if !p.eat(']') {
		for {
			p.ws()
			if !p.eat('{') {
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
			if p.eat(',') {
				continue
			}
			if !p.eat(']') {
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
	ok = p.object(func(key []byte) bool {
		switch {
		case string(key) == "type" && !seenType:
			seenType = true
			var ok bool
			typ, ok = p.str()
			return ok
		case string(key) == "text" && textAt < 0:
			if p.i >= len(p.d) || p.d[p.i] != '"' {
				// null gives "", another type no text: the full path
				// tells them apart.
				return false
			}
			textAt = p.i
			return p.skip()
		case foldsTo(key, "type", "text"):
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
	q := reqParser{d: p.d, i: textAt}
	text, ok = q.str()
	return text, true, ok
}

// reqParser reads JSON from d at i, at nesting depth (the body's object
// is 1). Every method reports false for input it declines, malformed
// input included.
type reqParser struct {
	d     []byte
	i     int
	depth int
}

func (p *reqParser) ws() {
	for p.i < len(p.d) {
		switch p.d[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// eat consumes c after optional white space.
func (p *reqParser) eat(c byte) bool {
	p.ws()
	if p.i < len(p.d) && p.d[p.i] == c {
		p.i++
		return true
	}
	return false
}

// object reads the members of an object whose '{' was consumed, calling
// member with each key, at the value; member reads the value.
func (p *reqParser) object(member func(key []byte) bool) bool {
	if p.eat('}') {
		return true
	}
	for {
		p.ws()
		key, ok := p.plainKey()
		if !ok || !p.eat(':') {
			return false
		}
		p.ws()
		if !member(key) {
			return false
		}
		if p.eat(',') {
			continue
		}
		return p.eat('}')
	}
}

// plainKey reads a key of printable ASCII without escapes: the only keys
// whose meaning to encoding/json (which matches field names without
// regard to case, Unicode folding included) foldsTo can tell.
func (p *reqParser) plainKey() ([]byte, bool) {
	if p.i >= len(p.d) || p.d[p.i] != '"' {
		return nil, false
	}
	start := p.i + 1
	for j := start; j < len(p.d); j++ {
		switch c := p.d[j]; {
		case c == '"':
			p.i = j + 1
			return p.d[start:j], true
		case c == '\\' || c < 0x20 || c >= utf8.RuneSelf:
			return nil, false
		}
	}
	return nil, false
}

// foldsTo reports whether ASCII key equals one of names without regard to
// case.
func foldsTo(key []byte, names ...string) bool {
	for _, n := range names {
		if len(key) != len(n) {
			continue
		}
		same := true
		for i := range len(n) {
			c := key[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != n[i] {
				same = false
				break
			}
		}
		if same {
			return true
		}
	}
	return false
}

// str reads a string value as encoding/json decodes it into a Go string.
func (p *reqParser) str() (string, bool) {
	start := p.i
	if start >= len(p.d) || p.d[start] != '"' {
		return "", false
	}
	end, esc, ok := strEnd(p.d, p.i)
	if !ok {
		return "", false
	}
	p.i = end
	if !esc {
		return string(p.d[start+1 : end-1]), true
	}
	out, _, ok := AppendJSONUnquoted(nil, p.d[start:end])
	return string(out), ok
}

// skip reads any JSON value, checking its syntax as encoding/json would.
func (p *reqParser) skip() bool {
	if p.i >= len(p.d) {
		return false
	}
	switch c := p.d[p.i]; {
	case c == '"':
		end, _, ok := strEnd(p.d, p.i)
		p.i = end
		return ok
	case c == '{':
		p.i++
		p.depth++
		if p.depth > maxDepth {
			return false
		}
		ok := p.object(func([]byte) bool { return p.skip() })
		p.depth--
		return ok
	case c == '[':
		p.i++
		p.depth++
		if p.depth > maxDepth {
			return false
		}
		ok := p.array()
		p.depth--
		return ok
	case c == 't':
		return p.lit("true")
	case c == 'f':
		return p.lit("false")
	case c == 'n':
		return p.lit("null")
	case c == '-' || ('0' <= c && c <= '9'):
		return p.number()
	}
	return false
}

// array reads the values of an array whose '[' was consumed.
func (p *reqParser) array() bool {
	if p.eat(']') {
		return true
	}
	for {
		p.ws()
		if !p.skip() {
			return false
		}
		if p.eat(',') {
			continue
		}
		return p.eat(']')
	}
}

func (p *reqParser) lit(s string) bool {
	if len(p.d)-p.i >= len(s) && string(p.d[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// number reads a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *reqParser) number() bool {
	d, i := p.d, p.i
	digits := func() bool {
		start := i
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	p.i = i
	return true
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
