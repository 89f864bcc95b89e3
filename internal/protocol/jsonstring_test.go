package protocol

import (
	"encoding/json"
	"testing"
)

var jsonStringSamples = []string{
	"", "Hello", " world", "line\nbreak", "tab\there", `"quoted" \back\slash/`,
	"<script>&amp;</script>", "\x00\x01\x1f\x7f", "\b\f\r", "é 日本 🎉", "\u2028\u2029",
	"bad \xff utf8 \xed\xa0\x80", "\xf0\x9f\x8e", "ends in \xe2\x80",
}

func TestAppendJSONString(t *testing.T) {
	t.Parallel()
	for _, s := range jsonStringSamples {
		want, _ := json.Marshal(s)
		if got := AppendJSONString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Errorf("AppendJSONString(%q) = %s, want x%s", s, got, want)
		}
	}
}

// Not parallel: AllocsPerRun counts the whole process's allocations.
func TestAppendJSONStringAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		for _, s := range jsonStringSamples {
			buf = AppendJSONString(buf[:0], s)
		}
	}); n != 0 {
		t.Errorf("AppendJSONString allocated %v times per run into a buffer large enough", n)
	}
}

// FuzzAppendJSONString holds AppendJSONString to encoding/json's bytes.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range jsonStringSamples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("AppendJSONString(%q) = %s, encoding/json %s", s, got, want)
		}
	})
}
