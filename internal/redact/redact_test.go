package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"http://127.0.0.1:8081/v1", "http://127.0.0.1:8081/v1"},
		{"http://user:s3cret@llm.example/v1", "http://user:xxxxx@llm.example/v1"},
		{"redis://:s3cret@redis:6379/0", "redis://:xxxxx@redis:6379/0"},
		{"https://s3cret@llm.example", "https://xxxxx@llm.example"},
		// Unparsable: the whole user part goes.
		{"http://user:s3cret@llm example/v1", "http://xxxxx@llm example/v1"},
		{"ftp://u:s3cret@%zz/x", "ftp://xxxxx@%zz/x"},
		{"u:s3cret@host:1%", "xxxxx@host:1%"},
		{"kafka:9092", "kafka:9092"},
		{"", ""},
	} {
		got := URL(tc.in)
		if got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("URL(%q) = %q keeps the secret", tc.in, got)
		}
	}
}

func TestURLs(t *testing.T) {
	t.Parallel()
	in := []string{"kafka:9092", "s3cret@kafka:9092", "user:s3cret@kafka:9093"}
	got := URLs(in)
	want := []string{"kafka:9092", "xxxxx@kafka:9092", "xxxxx@kafka:9093"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("URLs(%q) = %q, want %q", in, got, want)
	}
	if in[1] != "s3cret@kafka:9092" {
		t.Errorf("URLs changed its argument: %q", in)
	}
}

func TestText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`failed to send to http://u:s3cret@otel:4318/v1/traces: 401`, `failed to send to http://xxxxx@otel:4318/v1/traces: 401`},
		{`dial "redis://:s3cret@r:6379" and https://tok-s3cret@x/y`, `dial "redis://xxxxx@r:6379" and https://xxxxx@x/y`},
		{`no url here, a@b and http://host/path@x`, `no url here, a@b and http://host/path@x`},
	} {
		if got := Text(tc.in); got != tc.want {
			t.Errorf("Text(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzURL(f *testing.F) {
	f.Add("http://user:s3cret@llm.example/v1")
	f.Add("http://u:s3cret@bad host/")
	f.Fuzz(func(t *testing.T, raw string) {
		// Whatever the string, a password written user:s3cret@ is gone.
		in := "http://user:s3cret@" + raw
		if strings.Contains(raw, "s3cret") {
			return
		}
		if got := URL(in); strings.Contains(got, "s3cret") {
			t.Fatalf("URL(%q) = %q keeps the secret", in, got)
		}
	})
}
