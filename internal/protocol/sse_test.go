package protocol

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestSSEFramesGolden(t *testing.T) {
	t.Parallel()
	mustFrame := func(b []byte, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("building frame: %v", err)
		}
		return string(b)
	}
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"chunk", string(AppendChunkEvent(nil, 1, "Hel")), "id: 1\ndata: {\"content\":\"Hel\"}\n\n"},
		{"chunk seq 12", string(AppendChunkEvent(nil, 12, "lo")), "id: 12\ndata: {\"content\":\"lo\"}\n\n"},
		{"chunk with newlines and quotes", string(AppendChunkEvent(nil, 3, "a\n\nb\r\"c\"\\")),
			"id: 3\ndata: {\"content\":\"a\\n\\nb\\r\\\"c\\\"\\\\\"}\n\n"},
		{"chunk with NUL", string(AppendChunkEvent(nil, 4, "a\x00b")), "id: 4\ndata: {\"content\":\"a\\u0000b\"}\n\n"},
		{"chunk empty", string(AppendChunkEvent(nil, 5, "")), "id: 5\ndata: {\"content\":\"\"}\n\n"},
		{"chunk unicode", string(AppendChunkEvent(nil, 6, "你好🌊")), "id: 6\ndata: {\"content\":\"你好🌊\"}\n\n"},
		{"chunk appends", string(AppendChunkEvent([]byte(": ping\n\n"), 2, "x")), ": ping\n\nid: 2\ndata: {\"content\":\"x\"}\n\n"},
		{"ping", string(PingFrame), ": ping\n\n"},
		{"reset", mustFrame(AppendJSONEvent(nil, EventReset, Reset{Attempt: 2})), "event: reset\ndata: {\"attempt\":2}\n\n"},
		{
			"done",
			mustFrame(AppendJSONEvent(nil, EventDone, Done{
				RequestID: "req-1", FinishReason: "stop", Path: "queued",
				Usage: &Usage{PromptTokens: 3, CompletionTokens: 48, TotalTokens: 51},
			})),
			"event: done\ndata: {\"request_id\":\"req-1\",\"finish_reason\":\"stop\",\"path\":\"queued\"," +
				"\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":48,\"total_tokens\":51}}\n\n",
		},
		{
			"error",
			mustFrame(AppendJSONEvent(nil, EventError, NewProblem(ProblemQueueTimeout, "Queue Timeout", 503,
				"no worker started the request in time").WithRetryAfter(2))),
			"event: error\ndata: {\"type\":\"https://spillway.dev/errors/queue-timeout\",\"title\":\"Queue Timeout\"," +
				"\"status\":503,\"detail\":\"no worker started the request in time\",\"retry_after_seconds\":2}\n\n",
		},
		{
			"error detail with line break stays on one line",
			mustFrame(AppendJSONEvent(nil, EventError, NewProblem(ProblemProviderError, "Provider Error", 502, "a\nevent: done"))),
			"event: error\ndata: {\"type\":\"https://spillway.dev/errors/provider-error\",\"title\":\"Provider Error\"," +
				"\"status\":502,\"detail\":\"a\\nevent: done\"}\n\n",
		},
		{"plain event", mustFrame(AppendEvent(nil, "note", "7", "hello")), "id: 7\nevent: note\ndata: hello\n\n"},
		{"no name no id", mustFrame(AppendEvent(nil, "", "", "x")), "data: x\n\n"},
		{"empty data", mustFrame(AppendEvent(nil, "e", "", "")), "event: e\ndata: \n\n"},
		{"data LF", mustFrame(AppendEvent(nil, "", "", "a\nb")), "data: a\ndata: b\n\n"},
		{"data CRLF", mustFrame(AppendEvent(nil, "", "", "a\r\nb")), "data: a\ndata: b\n\n"},
		{"data CR", mustFrame(AppendEvent(nil, "", "", "a\rb")), "data: a\ndata: b\n\n"},
		{"data LF CR is two breaks", mustFrame(AppendEvent(nil, "", "", "a\n\rb")), "data: a\ndata: \ndata: b\n\n"},
		{"data trailing LF", mustFrame(AppendEvent(nil, "", "", "a\n")), "data: a\ndata: \n\n"},
		{"data blank lines", mustFrame(AppendEvent(nil, "", "", "\n\n")), "data: \ndata: \ndata: \n\n"},
		{"data injection attempt", mustFrame(AppendEvent(nil, "", "", "x\n\nevent: done\ndata: {}\nid: 9")),
			"data: x\ndata: \ndata: event: done\ndata: data: {}\ndata: id: 9\n\n"},
		{"data NUL replaced", mustFrame(AppendEvent(nil, "", "", "a\x00b")), "data: a\uFFFDb\n\n"},
		{"data leading space kept", mustFrame(AppendEvent(nil, "", "", " x")), "data:  x\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.got != tt.want {
				t.Errorf("frame =\n%q\nwant\n%q", tt.got, tt.want)
			}
			checkFrames(t, []byte(tt.got))
		})
	}
}

func TestAppendEventRefusesInjection(t *testing.T) {
	t.Parallel()
	bad := []string{"\n", "\r", "\x00", "a\nb", "a\rb", "a\r\nb", "done\n", "\ndata: x", "x\x00"}
	for _, v := range bad {
		for _, field := range []string{"name", "id"} {
			t.Run(fmt.Sprintf("%s=%q", field, v), func(t *testing.T) {
				t.Parallel()
				name, id := "ok", "1"
				if field == "name" {
					name = v
				} else {
					id = v
				}
				dst := []byte("prefix")
				got, err := AppendEvent(dst, name, id, "data")
				if !errors.Is(err, ErrFieldInjection) {
					t.Fatalf("AppendEvent(%q, %q) error = %v, want ErrFieldInjection", name, id, err)
				}
				if string(got) != "prefix" {
					t.Errorf("AppendEvent changed dst on error: %q", got)
				}
			})
		}
	}
	if _, err := AppendJSONEvent(nil, "done\nevent: x", Done{}); !errors.Is(err, ErrFieldInjection) {
		t.Errorf("AppendJSONEvent with a line break in the name: error = %v, want ErrFieldInjection", err)
	}
}

func TestAppendJSONEventMarshalError(t *testing.T) {
	t.Parallel()
	dst := []byte("keep")
	got, err := AppendJSONEvent(dst, EventDone, func() {})
	if err == nil {
		t.Fatal("AppendJSONEvent of a func succeeded")
	}
	if string(got) != "keep" {
		t.Errorf("AppendJSONEvent changed dst on error: %q", got)
	}
}

// TestAppendEventDataNeverInjects feeds every short combination of the
// interesting bytes through AppendEvent and parses the result back.
func TestAppendEventDataNeverInjects(t *testing.T) {
	t.Parallel()
	alphabet := []string{"\n", "\r", "\x00", "a", ":", " ", "data: ", "event: x", "id: 1", "\r\n"}
	var gen func(prefix string, depth int)
	n := 0
	gen = func(prefix string, depth int) {
		out, err := AppendEvent(nil, "reset", "3", prefix)
		if err != nil {
			t.Fatalf("AppendEvent(data=%q): %v", prefix, err)
		}
		ev := checkFrames(t, out)
		if len(ev) != 1 {
			t.Fatalf("data %q produced %d events, want 1:\n%q", prefix, len(ev), out)
		}
		want := strings.NewReplacer("\r\n", "\n", "\r", "\n", "\x00", "\uFFFD").Replace(prefix)
		if ev[0].data != want || ev[0].event != "reset" || ev[0].id != "3" {
			t.Fatalf("data %q parsed back as %+v, want data %q", prefix, ev[0], want)
		}
		n++
		if depth == 0 {
			return
		}
		for _, s := range alphabet {
			gen(prefix+s, depth-1)
		}
	}
	gen("", 4)
	if n < 1000 {
		t.Fatalf("only %d inputs tried", n)
	}
}

func TestChunkContentStaysOnOneLine(t *testing.T) {
	t.Parallel()
	contents := []string{"a\nb", "a\r\nb", "\r", "\n\nevent: done\ndata: {}\n\n", "x\x00y", "\u2028\u2029", "id: 5\n"}
	for _, c := range contents {
		t.Run(fmt.Sprintf("%q", c), func(t *testing.T) {
			t.Parallel()
			out := AppendChunkEvent(nil, 9, c)
			if got := strings.Count(string(out), "\n"); got != 3 {
				t.Fatalf("chunk frame has %d line feeds, want 3 (id, data, blank): %q", got, out)
			}
			ev := checkFrames(t, out)
			if len(ev) != 1 || ev[0].id != "9" || ev[0].event != "" {
				t.Fatalf("chunk frame parsed as %+v", ev)
			}
		})
	}
}

// sseEvent is one event as an EventSource would dispatch it.
type sseEvent struct {
	id, event, data string
}

// checkFrames parses SSE output strictly: only LF line ends, every
// non-empty line is an `id: `, `event: ` or `data: ` field or the ping
// comment, and the output ends right after one blank line. It returns the
// events an EventSource would dispatch (those with data).
func checkFrames(tb testing.TB, out []byte) []sseEvent {
	tb.Helper()
	s := string(out)
	if strings.ContainsAny(s, "\r") {
		tb.Fatalf("SSE output holds a CR: %q", s)
	}
	if !strings.HasSuffix(s, "\n\n") || strings.HasSuffix(s, "\n\n\n") {
		tb.Fatalf("SSE output does not end in exactly one blank line: %q", s)
	}
	var events []sseEvent
	var cur sseEvent
	var dataLines []string
	inFrame := false
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		switch {
		case line == "":
			if !inFrame {
				tb.Fatalf("blank line outside a frame in %q", s)
			}
			if dataLines != nil {
				cur.data = strings.Join(dataLines, "\n")
				events = append(events, cur)
			}
			cur, dataLines, inFrame = sseEvent{}, nil, false
		case line == ": ping":
			inFrame = true
		case strings.HasPrefix(line, "data: "):
			dataLines = append(dataLines, strings.TrimPrefix(line, "data: "))
			inFrame = true
		case strings.HasPrefix(line, "id: "):
			if strings.ContainsRune(line, 0) {
				tb.Fatalf("id line holds NUL: %q", line)
			}
			cur.id = strings.TrimPrefix(line, "id: ")
			inFrame = true
		case strings.HasPrefix(line, "event: "):
			cur.event = strings.TrimPrefix(line, "event: ")
			inFrame = true
		default:
			tb.Fatalf("line %q is not a valid SSE field in %q", line, s)
		}
	}
	if inFrame {
		tb.Fatalf("SSE output ends inside a frame: %q", s)
	}
	return events
}
