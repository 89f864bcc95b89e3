package protocol

// Top-level members of a JSON object, found and changed in place: how a
// request body is forwarded byte for byte with only the fields Spillway
// owns changed (docs/API.md, "What passes untouched"), and how an
// upstream chunk gets its id made ours. The input is JSON that was
// already validated (or came from an upstream that the caller decoded);
// on anything else the functions give up (ok false) rather than guess.

// member is where one top-level member of an object lies in its text.
type member struct {
	keyFrom  int // the opening quote of the key
	valFrom  int // the first byte of the value
	valTo    int // one past the last byte of the value
	key      []byte
	escaped  bool // the key holds an escape: compared only unescaped
	hasComma bool // a comma follows the value (another member comes)
}

// members lists the top-level members of the JSON object obj, in order.
// ok is false when obj is not an object this scanner can read.
func members(obj []byte) (list []member, ok bool) {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return nil, false
	}
	i = skipWS(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return nil, skipWS(obj, i+1) == len(obj)
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return nil, false
		}
		m := member{keyFrom: i}
		end, esc, ok := skipString(obj, i)
		if !ok {
			return nil, false
		}
		m.key, m.escaped = obj[i+1:end-1], esc
		i = skipWS(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false
		}
		i = skipWS(obj, i+1)
		m.valFrom = i
		if i, ok = skipValue(obj, i, 0); !ok {
			return nil, false
		}
		m.valTo = i
		i = skipWS(obj, i)
		if i >= len(obj) {
			return nil, false
		}
		switch obj[i] {
		case ',':
			m.hasComma = true
			list = append(list, m)
			i = skipWS(obj, i+1)
			continue
		case '}':
			list = append(list, m)
			return list, skipWS(obj, i+1) == len(obj)
		}
		return nil, false
	}
}

// MemberValue returns the raw value of the top-level member key of the
// JSON object obj (the last one when it is given twice, as encoding/json
// reads it), or nil.
func MemberValue(obj []byte, key string) []byte {
	list, ok := members(obj)
	if !ok {
		return nil
	}
	var v []byte
	for _, m := range list {
		if m.is(key) {
			v = obj[m.valFrom:m.valTo]
		}
	}
	return v
}

func (m member) is(key string) bool {
	if m.escaped {
		var s string
		if err := strictUnmarshal(append(append([]byte{'"'}, m.key...), '"'), &s); err != nil {
			return false
		}
		return s == key
	}
	return string(m.key) == key
}

// SetMember returns obj with the top-level member key set to the JSON
// value val: every occurrence of key has its value replaced, or, when
// there is none, the member is added last. The rest of obj is kept byte
// for byte. It returns obj unchanged and false when obj is not an object.
func SetMember(obj []byte, key string, val []byte) ([]byte, bool) {
	list, ok := members(obj)
	if !ok {
		return obj, false
	}
	out := make([]byte, 0, len(obj)+len(key)+len(val)+4)
	last := 0
	found := false
	for _, m := range list {
		if !m.is(key) {
			continue
		}
		found = true
		out = append(out, obj[last:m.valFrom]...)
		out = append(out, val...)
		last = m.valTo
	}
	if found {
		return append(out, obj[last:]...), true
	}
	if len(list) > 0 {
		// After the last value, before whatever precedes the '}'.
		lv := list[len(list)-1].valTo
		out = append(out, obj[:lv]...)
		out = append(out, ',')
		out = AppendJSONString(out, key)
		out = append(out, ':')
		out = append(out, val...)
		return append(out, obj[lv:]...), true
	}
	open := skipWS(obj, 0) + 1
	out = append(out, obj[:open]...)
	out = AppendJSONString(out, key)
	out = append(out, ':')
	out = append(out, val...)
	return append(out, obj[open:]...), true
}

// DeleteMember returns obj without its top-level members named key, the
// rest byte for byte.
func DeleteMember(obj []byte, key string) ([]byte, bool) {
	list, ok := members(obj)
	if !ok {
		return obj, false
	}
	out := make([]byte, 0, len(obj))
	last := 0
	for k, m := range list {
		if !m.is(key) {
			continue
		}
		from, to := m.keyFrom, m.valTo
		switch {
		case m.hasComma:
			// Drop through the comma after the value, and the space
			// before the next key.
			to = skipWS(obj, to)
			to = skipWS(obj, to+1)
		case k > 0:
			// The last member: drop the comma before it instead.
			prev := list[k-1].valTo
			if prev >= last {
				from = prev
			}
		}
		if from < last {
			from = last
		}
		out = append(out, obj[last:from]...)
		last = to
	}
	return append(out, obj[last:]...), true
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index after the string starting at b[i] ('"').
func skipString(b []byte, i int) (end int, escaped, ok bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped, true
		}
	}
	return 0, false, false
}

// maxDepth bounds the nesting skipValue follows (docs/API.md: a request
// is nested at most 64 deep).
const maxDepth = 64

// skipValue returns the index after the JSON value starting at b[i].
func skipValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; c {
	case '"':
		end, _, ok := skipString(b, i)
		return end, ok
	case '{', '[':
		if depth >= maxDepth {
			return 0, false
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == closer {
			return i + 1, true
		}
		for {
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return 0, false
				}
				end, _, ok := skipString(b, i)
				if !ok {
					return 0, false
				}
				i = skipWS(b, end)
				if i >= len(b) || b[i] != ':' {
					return 0, false
				}
				i = skipWS(b, i+1)
			}
			var ok bool
			if i, ok = skipValue(b, i, depth+1); !ok {
				return 0, false
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return 0, false
			}
			if b[i] == ',' {
				i = skipWS(b, i+1)
				continue
			}
			if b[i] != closer {
				return 0, false
			}
			return i + 1, true
		}
	default:
		// A number or a literal: up to the next delimiter.
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j, j > i
			}
			j++
		}
		return j, j > i
	}
}

// tooDeep reports whether the JSON value b nests deeper than max objects
// and arrays. b must be valid JSON.
func tooDeep(b []byte, max int) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			end, _, ok := skipString(b, i)
			if !ok {
				return false
			}
			i = end - 1
		case '{', '[':
			depth++
			if depth > max {
				return true
			}
		case '}', ']':
			depth--
		}
	}
	return false
}
