package loadtest

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/spillway-dev/spillway/internal/protocol"
)

var testWant = []string{"Hel", "lo", " wörld"}

// chunks returns chunk events numbered from first.
func chunks(first int, contents ...string) string {
	var b []byte
	for i, c := range contents {
		d, _ := json.Marshal(map[string]string{"content": c})
		b = protocol.AppendIDEvent(b, int64(first+i), "", d)
	}
	return string(b)
}

// event returns a named event with id whose data is v as JSON.
func event(tb testing.TB, id int, name string, v any) string {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return string(protocol.AppendIDEvent(nil, int64(id), name, b))
}

func TestCheckStream(t *testing.T) {
	t.Parallel()
	// Ids count over every event: done, error and reset take the id given.
	doneAt := func(id int) string {
		return event(t, id, protocol.EventDone, protocol.Done{RequestID: "r1", FinishReason: "stop", Path: "direct",
			Usage: &protocol.Usage{PromptTokens: 2, CompletionTokens: 3, TotalTokens: 5}})
	}
	problem := &protocol.Problem{Type: protocol.ProblemTypeBase + protocol.ProblemWorkerLost, Title: "Worker Lost", Status: 503, Detail: "gone"}
	errAt := func(id int) string { return event(t, id, protocol.EventError, problem) }
	resetAt := func(id int) string { return event(t, id, protocol.EventReset, protocol.Reset{Attempt: 2}) }
	done := doneAt(4) // after good
	queued := event(t, 1, protocol.EventQueued, protocol.Queued{Position: 3})
	good := chunks(1, testWant...)
	ping := string(protocol.PingFrame)

	tests := []struct {
		name     string
		stream   string
		want     []string // nil: testWant
		anyText  bool     // check without a wanted answer
		whole    bool     // too big to feed one byte at a time
		lost     LostReason
		terminal string
		chunks   int
		pings    int
		resets   int
		content  string
	}{
		{name: "complete", stream: good + done, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "complete with BOM", stream: "\uFEFF" + good + done, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "EOF without terminal", stream: good, lost: ReasonNoTerminal, chunks: 3},
		{name: "empty stream", stream: "", lost: ReasonNoTerminal},
		{name: "done cut before its blank line", stream: good + strings.TrimSuffix(done, "\n"), lost: ReasonNoTerminal, chunks: 3},
		{name: "done cut mid-line", stream: good + done[:len(done)/2], lost: ReasonNoTerminal, chunks: 3},
		{name: "done without data is not dispatched", stream: good + "id: 4\nevent: done\n\n", lost: ReasonNoTerminal, chunks: 3},
		{name: "gap 1,2,4", stream: chunks(1, "Hel", "lo") + chunks(4, " wörld") + doneAt(5), lost: ReasonSequence, chunks: 2},
		{name: "duplicate id", stream: chunks(1, "Hel", "lo") + chunks(2, " wörld") + done, lost: ReasonSequence, chunks: 2},
		{name: "starts at 0", stream: chunks(0, testWant...) + doneAt(3), lost: ReasonSequence},
		{name: "chunk without id", stream: "data: {\"content\":\"Hel\"}\n\n" + done, lost: ReasonSequence},
		{name: "non-numeric id", stream: "id: one\ndata: {\"content\":\"Hel\"}\n\n" + done, lost: ReasonSequence},
		{name: "done without id", stream: good + "event: done\ndata: {}\n\n", lost: ReasonSequence, chunks: 3, content: "Hello wörld"},
		{name: "done with a repeated id", stream: good + doneAt(3), lost: ReasonSequence, chunks: 3, content: "Hello wörld"},
		{name: "done skipping an id", stream: good + doneAt(5), lost: ReasonSequence, chunks: 3, content: "Hello wörld"},
		{name: "error without id", stream: good + "event: error\ndata: {\"type\":\"x\"}\n\n", lost: ReasonSequence, chunks: 3, content: "Hello wörld"},
		{name: "wrong content", stream: chunks(1, "Hel", "LO", " wörld") + done, lost: ReasonContent, terminal: "done", chunks: 3, content: "HelLO wörld"},
		{name: "missing last chunk", stream: chunks(1, "Hel", "lo") + doneAt(3), lost: ReasonContent, terminal: "done", chunks: 2, content: "Hello"},
		{name: "wrong content without want", stream: chunks(1, "Hel", "LO") + doneAt(3), anyText: true, terminal: "done", chunks: 2, content: "HelLO"},
		{name: "empty want needs empty answer", stream: chunks(1, "x") + doneAt(2), want: []string{}, lost: ReasonContent, terminal: "done", chunks: 1, content: "x"},
		{name: "queued then answer", stream: queued + chunks(2, testWant...) + doneAt(5), terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "queued without id", stream: "event: queued\ndata: {\"position\":1}\n\n" + good + done, lost: ReasonSequence},
		{name: "queued with bad data", stream: "id: 1\nevent: queued\ndata: 1\n\n" + chunks(2, testWant...) + doneAt(5), lost: ReasonMalformed},
		{name: "reset then full answer", stream: chunks(1, "Hel", "XX") + ping + resetAt(3) + chunks(4, testWant...) + doneAt(7),
			terminal: "done", chunks: 5, pings: 1, resets: 1, content: "Hello wörld"},
		{name: "reset then wrong answer", stream: chunks(1, "Hel", "lo") + resetAt(3) + chunks(4, "Hel", "lo") + doneAt(6),
			lost: ReasonContent, terminal: "done", chunks: 4, resets: 1, content: "Hello"},
		{name: "ids restarted after a reset", stream: chunks(1, "Hel", "lo") + resetAt(3) + chunks(1, testWant...) + doneAt(4),
			lost: ReasonSequence, chunks: 2, resets: 1},
		{name: "reset without id", stream: chunks(1, "Hel", "lo") + "event: reset\ndata: {\"attempt\":2}\n\n" + chunks(3, testWant...) + doneAt(6),
			lost: ReasonSequence, chunks: 2, content: "Hello"},
		{name: "reset with bad data", stream: chunks(1, "Hel") + "id: 2\nevent: reset\ndata: 2\n\n" + chunks(3, testWant...) + doneAt(6), lost: ReasonMalformed, chunks: 1},
		{name: "error terminal", stream: chunks(1, "Hel") + errAt(2), terminal: "error", chunks: 1, content: "Hel"},
		{name: "error terminal first", stream: ping + errAt(1), terminal: "error", pings: 1},
		{name: "error without type", stream: "id: 1\nevent: error\ndata: {\"title\":\"x\",\"status\":503}\n\n", lost: ReasonMalformed},
		{name: "error with bad JSON", stream: "id: 1\nevent: error\ndata: {\n\n", lost: ReasonMalformed},
		{name: "two dones", stream: good + done + doneAt(5), lost: ReasonDuplicateTerminal, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "done then error", stream: good + done + errAt(5), lost: ReasonDuplicateTerminal, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "error then done", stream: errAt(1) + chunks(2, testWant...) + doneAt(5), lost: ReasonAfterTerminal, terminal: "error"},
		{name: "chunk after done", stream: good + done + chunks(5, "!"), lost: ReasonAfterTerminal, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "retrying before the answer", stream: "id: 1\nevent: retrying\ndata: {\"attempt\":2,\"retry_in_seconds\":2,\"reason\":\"throttled\"}\n\n" + chunks(2, testWant...) + doneAt(5),
			terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "retrying without a reason", stream: "id: 1\nevent: retrying\ndata: {\"attempt\":2,\"retry_in_seconds\":2}\n\n" + chunks(2, testWant...) + doneAt(5), lost: ReasonMalformed},
		{name: "ping after done", stream: good + done + ping, lost: ReasonAfterTerminal, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "partial line after done", stream: good + done + "id: 5", lost: ReasonAfterTerminal, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "blank lines after done", stream: good + done + "\n\n", terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "pings counted", stream: ping + chunks(1, "Hel") + ping + chunks(2, "lo", " wörld") + ping + done,
			terminal: "done", chunks: 3, pings: 3, content: "Hello wörld"},
		{name: "other comments are not pings", stream: ": hello\n\n:ping\n\n" + good + done, terminal: "done", chunks: 3, pings: 1, content: "Hello wörld"},
		{name: "CRLF", stream: strings.ReplaceAll(ping+good+done, "\n", "\r\n"), terminal: "done", chunks: 3, pings: 1, content: "Hello wörld"},
		{name: "CR", stream: strings.ReplaceAll(good+done, "\n", "\r"), terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "CRLF cut without terminal", stream: strings.ReplaceAll(good, "\n", "\r\n"), lost: ReasonNoTerminal, chunks: 3},
		{name: "multi-line data", stream: "id: 1\ndata: {\"content\":\ndata: \"Hel\"}\n\n" + chunks(2, "lo", " wörld") +
			"id: 4\nevent: done\ndata: {\"finish_reason\":\ndata: \"stop\"}\n\n", terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "multi-line data joined with LF", stream: "id: 1\ndata: {\"content\":\"He\ndata: l\"}\n\n" + doneAt(2), lost: ReasonMalformed},
		{name: "data without space and message event", stream: "id:1\nevent: message\ndata:{\"content\":\"Hel\"}\n\n" + chunks(2, "lo", " wörld") + done,
			terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "retry and unknown fields ignored", stream: "retry: 10\nfoo: bar\n\n" + good + done, terminal: "done", chunks: 3, content: "Hello wörld"},
		{name: "chunk data not JSON", stream: "id: 1\ndata: Hel\n\n" + doneAt(2), lost: ReasonMalformed},
		{name: "chunk data JSON string", stream: "id: 1\ndata: \"Hel\"\n\n" + doneAt(2), lost: ReasonMalformed},
		{name: "chunk without content", stream: "id: 1\ndata: {\"text\":\"Hel\"}\n\n" + doneAt(2), lost: ReasonMalformed},
		{name: "chunk with trailing data", stream: "id: 1\ndata: {\"content\":\"Hel\"} {}\n\n" + doneAt(2), lost: ReasonMalformed},
		{name: "done with bad JSON", stream: good + "id: 4\nevent: done\ndata: stop\n\n", lost: ReasonMalformed, chunks: 3, content: "Hello wörld"},
		{name: "unknown event", stream: good + "id: 4\nevent: finished\ndata: {}\n\n" + doneAt(5), lost: ReasonMalformed, chunks: 3, content: "Hello wörld"},
		{name: "line too long", stream: "id: 1\ndata: {\"content\":\"" + strings.Repeat("x", maxLineBytes) + "\"}\n\n" + doneAt(2), lost: ReasonMalformed, whole: true},
	}
	readers := map[string]func(io.Reader) io.Reader{
		"whole":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
	}
	for _, tt := range tests {
		for rname, wrap := range readers {
			if tt.whole && rname != "whole" {
				continue
			}
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				t.Parallel()
				want := tt.want
				if want == nil && !tt.anyText {
					want = testWant
				}
				rep := StreamCheck{Want: want}.Check(wrap(strings.NewReader(tt.stream)))
				if rep.Lost != (tt.lost != "") || rep.Reason != tt.lost {
					t.Fatalf("lost = %v (%s: %s), want reason %q", rep.Lost, rep.Reason, rep.Detail, tt.lost)
				}
				if rep.Lost && rep.Detail == "" {
					t.Error("lost stream without detail")
				}
				if rep.Terminal != tt.terminal {
					t.Errorf("terminal = %q, want %q", rep.Terminal, tt.terminal)
				}
				if rep.Chunks != tt.chunks || rep.Pings != tt.pings || rep.Resets != tt.resets {
					t.Errorf("chunks, pings, resets = %d, %d, %d, want %d, %d, %d",
						rep.Chunks, rep.Pings, rep.Resets, tt.chunks, tt.pings, tt.resets)
				}
				if tt.content != "" && rep.Content != tt.content {
					t.Errorf("content = %q, want %q", rep.Content, tt.content)
				}
				if rep.Stopped {
					t.Error("stopped without StopAfter")
				}
			})
		}
	}
}

func TestCheckStreamPayloads(t *testing.T) {
	t.Parallel()
	done := event(t, 4, protocol.EventDone, protocol.Done{RequestID: "r1", FinishReason: "length", Path: "queued",
		Usage: &protocol.Usage{PromptTokens: 2, CompletionTokens: 3, TotalTokens: 5}})
	rep := StreamCheck{Want: testWant}.Check(strings.NewReader(chunks(1, testWant...) + done))
	if rep.Lost || rep.Done == nil {
		t.Fatalf("report %+v", rep)
	}
	if rep.Done.FinishReason != "length" || rep.Done.Path != "queued" || rep.Done.Usage == nil || rep.Done.Usage.TotalTokens != 5 {
		t.Errorf("done = %+v", rep.Done)
	}
	if rep.FirstChunk <= 0 || rep.Total < rep.FirstChunk {
		t.Errorf("first chunk %v, total %v", rep.FirstChunk, rep.Total)
	}

	p := (&protocol.Problem{Type: protocol.ProblemTypeBase + protocol.ProblemQueueTimeout, Title: "Queue Timeout", Status: 503, Detail: "waited"}).WithRetryAfter(2)
	rep = StreamCheck{Want: testWant}.Check(strings.NewReader(event(t, 1, protocol.EventError, p)))
	if rep.Lost || rep.Problem == nil || rep.Problem.Type != protocol.ProblemTypeBase+protocol.ProblemQueueTimeout ||
		rep.Problem.RetryAfterSeconds != 2 {
		t.Errorf("error report %+v, problem %+v", rep, rep.Problem)
	}
	if rep.FirstChunk != 0 {
		t.Errorf("first chunk %v without chunks", rep.FirstChunk)
	}
}

func TestStreamCheckStopAfter(t *testing.T) {
	t.Parallel()
	done := event(t, 4, protocol.EventDone, protocol.Done{FinishReason: "stop"})
	tests := []struct {
		name      string
		stopAfter int
		stopped   bool
		chunks    int
	}{
		{"stops mid-stream", 2, true, 2},
		{"stops at the last chunk before done", 3, true, 3},
		{"stream ends first", 4, false, 3},
		{"off", 0, false, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep := StreamCheck{Want: testWant, StopAfter: tt.stopAfter}.Check(strings.NewReader(chunks(1, testWant...) + done))
			if rep.Stopped != tt.stopped || rep.Chunks != tt.chunks || rep.Lost {
				t.Errorf("stopped %v chunks %d lost %v (%s), want stopped %v chunks %d",
					rep.Stopped, rep.Chunks, rep.Lost, rep.Detail, tt.stopped, tt.chunks)
			}
		})
	}
}

// errAfterReader returns its data and then err instead of io.EOF.
type errAfterReader struct {
	r   io.Reader
	err error
}

func (e *errAfterReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		return n, e.err
	}
	return n, err
}

func TestCheckStreamReadErrors(t *testing.T) {
	t.Parallel()
	cut := errors.New("connection reset")
	done := event(t, 4, protocol.EventDone, protocol.Done{FinishReason: "stop"})
	tests := []struct {
		name   string
		stream string
		lost   bool
	}{
		{"cut before terminal", chunks(1, "Hel", "lo"), true},
		{"cut after done", chunks(1, testWant...) + done, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep := StreamCheck{Want: testWant}.Check(&errAfterReader{strings.NewReader(tt.stream), cut})
			if !errors.Is(rep.Err, cut) {
				t.Errorf("err = %v, want %v", rep.Err, cut)
			}
			if rep.Lost != tt.lost {
				t.Errorf("lost = %v (%s), want %v", rep.Lost, rep.Detail, tt.lost)
			}
			if tt.lost && (rep.Reason != ReasonNoTerminal || !strings.Contains(rep.Detail, "connection reset")) {
				t.Errorf("reason %s detail %q", rep.Reason, rep.Detail)
			}
		})
	}
}

// A resumed stream continues the ids after AfterID; one that starts
// anywhere else is broken.
func TestCheckResumedStream(t *testing.T) {
	t.Parallel()
	done := event(t, 4, protocol.EventDone, protocol.Done{FinishReason: "stop"})
	rep := StreamCheck{AfterID: 2, Want: testWant[2:]}.Check(strings.NewReader(chunks(3, testWant[2]) + done))
	if rep.Lost || rep.Terminal != protocol.EventDone || rep.Content != testWant[2] {
		t.Fatalf("resumed after 2: %+v", rep)
	}
	for _, first := range []int{1, 2, 4} {
		rep := StreamCheck{AfterID: 2}.Check(strings.NewReader(chunks(first, testWant[2]) + done))
		if rep.Reason != ReasonSequence {
			t.Errorf("resumed after 2 starting at %d: %+v, want sequence", first, rep)
		}
	}
}
