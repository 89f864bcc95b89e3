package protocol

import (
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// AppendJSONString appends s as a JSON string, byte for byte as
// encoding/json encodes a string (HTML characters, U+2028 and U+2029
// escaped, an invalid UTF-8 byte as \ufffd), without its allocations: the
// per-chunk encoders use it (FuzzAppendJSONString holds it to
// encoding/json). JSON escapes CR, LF and NUL, so the result cannot start
// another SSE line.
func AppendJSONString(dst []byte, s string) []byte {
	return appendJSONString(dst, s, true)
}

// appendJSONString is AppendJSONString; with escapeHTML false it leaves
// `<`, `>` and `&` as they are, as json.Encoder.SetEscapeHTML(false) does.
func appendJSONString(dst []byte, s string, escapeHTML bool) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && (!escapeHTML || (b != '<' && b != '>' && b != '&')) {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendJSONUnquoted reads the JSON string at the start of src and
// appends its value to dst as encoding/json decodes a string: escapes
// resolved, an invalid UTF-8 byte or a lone surrogate replaced by U+FFFD.
// n is how many bytes of src the string took, quotes included; ok is
// false when src does not start with a valid JSON string.
func AppendJSONUnquoted(dst, src []byte) (out []byte, n int, ok bool) {
	if len(src) == 0 || src[0] != '"' {
		return dst, 0, false
	}
	i := 1
	for i < len(src) {
		c := src[i]
		switch {
		case c == '"':
			return dst, i + 1, true
		case c < 0x20:
			return dst, 0, false
		case c == '\\':
			if i+1 >= len(src) {
				return dst, 0, false
			}
			i += 2
			switch src[i-1] {
			case '"', '\\', '/':
				dst = append(dst, src[i-1])
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				r := hex4(src[i:])
				if r < 0 {
					return dst, 0, false
				}
				i += 4
				if utf16.IsSurrogate(r) {
					// A pair when a valid low half follows at once; else
					// the lone half is replaced and what follows read on
					// its own, as encoding/json does.
					if r2 := u4(src[i:]); r2 >= 0 {
						if dec := utf16.DecodeRune(r, r2); dec != unicode.ReplacementChar {
							dst = utf8.AppendRune(dst, dec)
							i += 6
							continue
						}
					}
					r = unicode.ReplacementChar
				}
				dst = utf8.AppendRune(dst, r)
			default:
				return dst, 0, false
			}
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, size := utf8.DecodeRune(src[i:])
			if r == utf8.RuneError && size == 1 {
				dst = utf8.AppendRune(dst, utf8.RuneError)
			} else {
				dst = append(dst, src[i:i+size]...)
			}
			i += size
		}
	}
	return dst, 0, false
}

// hex4 reads four hex digits as a rune, -1 if they are not.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// u4 reads `\uXXXX` as a rune, -1 if b does not start with one.
func u4(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	return hex4(b[2:])
}
