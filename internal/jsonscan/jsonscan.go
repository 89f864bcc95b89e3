// Package jsonscan is the byte scanner under the one-pass JSON readers of
// a chat request (protocol) and of a provider's stream chunk (llm): white
// space, punctuation, objects with plain keys, literals and numbers,
// checked as encoding/json checks them. It imports nothing of the module.
package jsonscan

import "unicode/utf8"

// Scanner reads JSON from D at I. Every method reports false for input
// it declines, malformed input included; the readers that embed it then
// take their full encoding/json path.
type Scanner struct {
	D []byte
	I int
}

// WS skips white space.
func (p *Scanner) WS() {
	for p.I < len(p.D) {
		switch p.D[p.I] {
		case ' ', '\t', '\n', '\r':
			p.I++
		default:
			return
		}
	}
}

// Eat consumes c after optional white space.
func (p *Scanner) Eat(c byte) bool {
	p.WS()
	if p.I < len(p.D) && p.D[p.I] == c {
		p.I++
		return true
	}
	return false
}

// Object reads the members of an object whose '{' was consumed, calling
// member with each key, at the value; member reads the value.
func (p *Scanner) Object(member func(key []byte) bool) bool {
	if p.Eat('}') {
		return true
	}
	for {
		p.WS()
		key, ok := p.PlainKey()
		if !ok || !p.Eat(':') {
			return false
		}
		p.WS()
		if !member(key) {
			return false
		}
		if p.Eat(',') {
			continue
		}
		return p.Eat('}')
	}
}

// PlainKey reads a key of printable ASCII without escapes: the only keys
// whose meaning to encoding/json (which matches field names without
// regard to case, Unicode folding included) FoldsTo can tell.
func (p *Scanner) PlainKey() ([]byte, bool) {
	if p.I >= len(p.D) || p.D[p.I] != '"' {
		return nil, false
	}
	start := p.I + 1
	for j := start; j < len(p.D); j++ {
		switch c := p.D[j]; {
		case c == '"':
			p.I = j + 1
			return p.D[start:j], true
		case c == '\\' || c < 0x20 || c >= utf8.RuneSelf:
			return nil, false
		}
	}
	return nil, false
}

// FoldsTo reports whether ASCII key equals one of names without regard to
// case.
func FoldsTo(key []byte, names ...string) bool {
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

// Lit reads the literal s (true, false, null).
func (p *Scanner) Lit(s string) bool {
	if len(p.D)-p.I >= len(s) && string(p.D[p.I:p.I+len(s)]) == s {
		p.I += len(s)
		return true
	}
	return false
}

// Number reads a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *Scanner) Number() bool {
	d, i := p.D, p.I
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
	p.I = i
	return true
}
