package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestNumber(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		ok   bool
		rest int // bytes left after the number
	}{
		{"0", true, 0},
		{"-0", true, 0},
		{"12", true, 0},
		{"-12.5e+3", true, 0},
		{"1E9", true, 0},
		{"0.25,", true, 1},
		{"01", true, 1}, // the number is 0; the caller sees the 1 that follows
		{"-", false, 0},
		{"1.", false, 0},
		{".5", false, 0},
		{"1e", false, 0},
		{"1e+", false, 0},
		{"+1", false, 0},
		{"", false, 0},
	} {
		p := Scanner{D: []byte(tc.in)}
		ok := p.Number()
		if ok != tc.ok {
			t.Errorf("Number(%q) = %v, want %v", tc.in, ok, tc.ok)
			continue
		}
		if ok && len(tc.in)-p.I != tc.rest {
			t.Errorf("Number(%q) stopped at %d, want %d bytes left", tc.in, p.I, tc.rest)
		}
		if !ok && p.I != 0 {
			t.Errorf("Number(%q) declined but moved to %d", tc.in, p.I)
		}
	}
}

func TestObject(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		keys []string
		ok   bool
	}{
		{`{}`, nil, true},
		{` { "a" : 1 , "B":2 } `, []string{"a", "B"}, true},
		{`{"a":1,}`, []string{"a"}, false},
		{`{"a" 1}`, nil, false},
		{`{"a\"b":1}`, nil, false}, // an escaped key is declined
		{`{"é":1}`, nil, false},    // so is one not ASCII
		{"{\"a\tb\":1}", nil, false},
		{`{"a":1`, []string{"a"}, false},
		{`{"a`, nil, false},
	} {
		p := Scanner{D: []byte(tc.in)}
		var keys []string
		ok := p.Eat('{') && p.Object(func(key []byte) bool {
			keys = append(keys, string(key))
			return p.Number()
		})
		if ok != tc.ok {
			t.Errorf("Object(%q) = %v, want %v", tc.in, ok, tc.ok)
		}
		if len(keys) != len(tc.keys) {
			t.Errorf("Object(%q) keys %q, want %q", tc.in, keys, tc.keys)
			continue
		}
		for i := range keys {
			if keys[i] != tc.keys[i] {
				t.Errorf("Object(%q) keys %q, want %q", tc.in, keys, tc.keys)
				break
			}
		}
	}
}

func TestFoldsTo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key   string
		names []string
		want  bool
	}{
		{"Content", []string{"role", "content"}, true},
		{"CONTENT", []string{"content"}, true},
		{"content_", []string{"content"}, false},
		{"cont", []string{"content"}, false},
		{"", nil, false},
	} {
		if got := FoldsTo([]byte(tc.key), tc.names...); got != tc.want {
			t.Errorf("FoldsTo(%q, %q) = %v, want %v", tc.key, tc.names, got, tc.want)
		}
	}
}

func TestLit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, lit string
		want    bool
	}{
		{"null", "null", true},
		{"true]", "true", true},
		{"nul", "null", false},
		{"fals", "false", false},
		{"nulL", "null", false},
	} {
		p := Scanner{D: []byte(tc.in)}
		if got := p.Lit(tc.lit); got != tc.want || got && p.I != len(tc.lit) {
			t.Errorf("Lit(%q) on %q = %v at %d, want %v", tc.lit, tc.in, got, p.I, tc.want)
		}
	}
}

// FuzzNumber holds Number to encoding/json: whatever it reads whole is a
// valid JSON number, and a valid number is read whole.
func FuzzNumber(f *testing.F) {
	for _, s := range []string{"0", "-1.5e10", "01", "1.", "1e+9", "-", "00", "1.0E-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := Scanner{D: []byte(s)}
		whole := p.Number() && p.I == len(s)
		// A valid JSON text that starts with '-' or a digit and ends with
		// a digit (no white space around) is a number.
		valid := len(s) > 0 && (s[0] == '-' || isDigit(s[0])) && isDigit(s[len(s)-1]) && json.Valid([]byte(s))
		if whole != valid {
			t.Fatalf("Number(%q) read it whole: %v; encoding/json takes it as a number: %v", s, whole, valid)
		}
	})
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
