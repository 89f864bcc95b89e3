package protocol

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSSEFramesGolden pins the frames the stream log stores and the
// relays write: AppendIDEvent's id, optional name and one data line.
func TestSSEFramesGolden(t *testing.T) {
	t.Parallel()
	mustJSON := func(v any) []byte {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"chunk", string(AppendIDEvent(nil, 1, "", []byte(`{"content":"Hel"}`))), "id: 1\ndata: {\"content\":\"Hel\"}\n\n"},
		{"chunk with newlines, quotes and NUL", string(AppendIDEvent(nil, 3, "", mustJSON(map[string]string{"content": "a\n\nb\r\"c\"\\\x00"}))),
			"id: 3\ndata: {\"content\":\"a\\n\\nb\\r\\\"c\\\"\\\\\\u0000\"}\n\n"},
		{"chunk unicode", string(AppendIDEvent(nil, 6, "", mustJSON(map[string]string{"content": "你好🌊"}))), "id: 6\ndata: {\"content\":\"你好🌊\"}\n\n"},
		{"appends", string(AppendIDEvent([]byte(": ping\n\n"), 2, "", []byte(`{"content":"x"}`))), ": ping\n\nid: 2\ndata: {\"content\":\"x\"}\n\n"},
		{"ping", string(PingFrame), ": ping\n\n"},
		{"reset", string(AppendIDEvent(nil, 4, EventReset, mustJSON(Reset{Attempt: 2}))), "id: 4\nevent: reset\ndata: {\"attempt\":2}\n\n"},
		{
			"done",
			string(AppendIDEvent(nil, 9, EventDone, mustJSON(Done{
				RequestID: "req-1", FinishReason: "stop", Path: "queued",
				Usage: &Usage{PromptTokens: 3, CompletionTokens: 48, TotalTokens: 51},
			}))),
			"id: 9\nevent: done\ndata: {\"request_id\":\"req-1\",\"finish_reason\":\"stop\",\"path\":\"queued\"," +
				"\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":48,\"total_tokens\":51}}\n\n",
		},
		{
			"error detail with line break stays on one line",
			string(AppendIDEvent(nil, 5, EventError, mustJSON((&Problem{
				Type: ProblemTypeBase + ProblemQueueTimeout, Title: "Queue Timeout", Status: 503, Detail: "a\nevent: done",
			}).WithRetryAfter(2)))),
			"id: 5\nevent: error\ndata: {\"type\":\"https://spillway.dev/errors/queue-timeout\",\"title\":\"Queue Timeout\"," +
				"\"status\":503,\"detail\":\"a\\nevent: done\",\"retry_after_seconds\":2}\n\n",
		},
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
