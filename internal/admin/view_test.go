package admin

import "testing"

// A prompt or answer cannot drive the operator's terminal: escape
// sequences, bells and invalid UTF-8 are defused; line breaks and tabs
// stay.
func TestClean(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text":                   "plain text",
		"two\nlines\tand a tab":        "two\nlines\tand a tab",
		"\x1b[2J\x1b]0;owned\x07hello": "\uFFFD[2J\uFFFD]0;owned\uFFFDhello",
		"carriage\rreturn":             "carriage\uFFFDreturn",
		"bad \xff utf8":                "bad \uFFFD utf8",
		"c1 \u009b control":            "c1 \uFFFD control",
		"unicode stays: żółw, 漢字, 🙂":   "unicode stays: żółw, 漢字, 🙂",
	} {
		if got := clean(in); got != want {
			t.Errorf("clean(%q) = %q, want %q", in, got, want)
		}
	}
}
