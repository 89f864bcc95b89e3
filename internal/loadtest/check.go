// Package loadtest owns the load generator behind cmd/loadtest: an SSE
// stream checker that decides whether one stream arrived whole, and a runner
// that floods /v1/stream (or an OpenAI-compatible upstream, to compare with)
// and accounts for every request it sent.
package loadtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// LostReason names why a stream counts as lost.
type LostReason string

// The reasons a stream is lost. The first six come from the checker, the
// rest from the runner.
const (
	// ReasonNoTerminal: the stream ended (EOF or a cut connection) before
	// a done or error event.
	ReasonNoTerminal LostReason = "no-terminal"
	// ReasonSequence: a chunk id was missing, repeated, out of order or
	// not a number.
	ReasonSequence LostReason = "sequence"
	// ReasonContent: done arrived but the answer differs from the expected one.
	ReasonContent LostReason = "content"
	// ReasonDuplicateTerminal: a second done or error followed the first.
	ReasonDuplicateTerminal LostReason = "duplicate-terminal"
	// ReasonAfterTerminal: something other than a terminal followed the
	// terminal event.
	ReasonAfterTerminal LostReason = "after-terminal"
	// ReasonMalformed: an event's data was not what the contract says, an
	// unknown event arrived, or a line was too long.
	ReasonMalformed LostReason = "malformed"
	// ReasonTimeout: the stream did not end within Config.Timeout.
	ReasonTimeout LostReason = "timeout"
	// ReasonTransport: the request failed before any response arrived.
	ReasonTransport LostReason = "transport"
	// ReasonBadResponse: a 200 response that is not text/event-stream.
	ReasonBadResponse LostReason = "bad-response"
)

// maxLineBytes bounds one SSE line; a longer line makes the stream malformed
// instead of growing memory.
const maxLineBytes = 1 << 20

// Report is the checker's verdict on one SSE stream.
type Report struct {
	// Terminal is protocol.EventDone, protocol.EventError, or "" when no
	// terminal event arrived.
	Terminal string
	// Done is the payload of the done event.
	Done *protocol.Done
	// Problem is the payload of the error event.
	Problem *protocol.Problem
	// Chunks counts chunk events over all attempts.
	Chunks int
	// Pings counts `: ping` comments.
	Pings int
	// PingIntervals holds, for each `: ping`, the time since the previous
	// ping or dispatched event on the stream, or since reading began for
	// the first one: with the server's heartbeat timer reset after each
	// write, each should be close to the heartbeat interval.
	PingIntervals []time.Duration
	// MaxGap is the longest silence on the stream: the most time between
	// the start of reading, each ping and each dispatched event, up to
	// the terminal event. 0 when nothing arrived.
	MaxGap time.Duration
	// LastID is the id of the last event read: what a resume sends as
	// Last-Event-ID.
	LastID int
	// Resets counts reset events.
	Resets int
	// Retryings counts retrying events (a backoff before another provider
	// call; docs/API.md).
	Retryings int
	// Content is the concatenated content since the last reset.
	Content string
	// FirstChunk is the time from StreamCheck.Start to the first chunk
	// event, 0 when none arrived.
	FirstChunk time.Duration
	// Total is the time from StreamCheck.Start to the terminal event, or to
	// the end of reading when there was none.
	Total time.Duration
	// Stopped is set when reading stopped on purpose after
	// StreamCheck.StopAfter chunks, before a terminal event.
	Stopped bool
	// Lost is set when the stream broke the contract; Reason and Detail
	// say how. A stream that ends in an error event is not lost.
	Lost   bool
	Reason LostReason
	Detail string
	// Err is the read error that ended the stream, nil on a clean EOF.
	Err error
}

// Format names the wire format a StreamCheck expects.
type Format int

const (
	// FormatSpillway is Spillway's /v1/stream: chunk events with ids,
	// reset, done and error events.
	FormatSpillway Format = iota
	// FormatOpenAI is an OpenAI-compatible chat completion stream:
	// `data: {"choices":[{"delta":{"content":…}}]}` events without ids,
	// ended by `data: [DONE]`; an event carrying an "error" object ends
	// the stream as an error.
	FormatOpenAI
)

// StreamCheck parses one SSE stream as the WHATWG EventSource algorithm
// does (fields id, event and data; data lines joined with "\n"; comments;
// dispatch on a blank line; LF, CRLF or CR line ends; an event cut off by
// the end of the stream is not dispatched) and checks it against the
// Spillway contract: every event (chunks, reset, queued, retrying and the
// terminal one) carries an id, the ids count 1, 2, 3, … over the whole
// stream and never restart, a reset voids the content so far, exactly one
// terminal event and nothing after it.
type StreamCheck struct {
	// Want is the expected answer, one string per chunk; nil skips the
	// content check. The content after the last reset must equal
	// strings.Join(Want, "") when done arrives.
	Want []string
	// Start is when the request was sent; the zero value means when Check
	// is called.
	Start time.Time
	// StopAfter, when positive, makes Check return with Stopped set once
	// that many chunk events have arrived and no terminal event yet.
	StopAfter int
	// AfterID, for a resumed stream (GET /v1/streams/{id} with
	// Last-Event-ID), is the id the stream continues after: its first
	// event must have id AfterID+1. Want then is the part of the answer
	// after that point.
	AfterID int
	// Format is the wire format; the zero value is FormatSpillway. With
	// FormatOpenAI a chunk is an event with non-empty delta content, the
	// `[DONE]` event is the done terminal (Done.Path "upstream"), and
	// there are no ids to check.
	Format Format
}

// Check reads r until its end, the first contract violation, or StopAfter
// chunks, and reports what it saw. It does not close r.
func (c StreamCheck) Check(r io.Reader) Report {
	start := c.Start
	if start.IsZero() {
		start = time.Now()
	}
	p := parser{check: c, start: start, next: c.AfterID + 1, last: time.Now()}
	var partial bool // the last token had no line end
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		adv, tok, err := splitLine(data, atEOF)
		partial = atEOF && tok != nil && adv == len(data) && !endsWithEOL(data)
		return adv, tok, err
	})
	first := true
	for sc.Scan() {
		line := sc.Bytes()
		if first {
			line = bytes.TrimPrefix(line, []byte("\uFEFF"))
			first = false
		}
		if partial {
			// A line cut off by the end of the stream belongs to an event
			// that is never dispatched.
			p.pending = true
			break
		}
		if p.line(line) {
			if p.rep.Terminal == "" {
				p.rep.Total = time.Since(start)
			}
			return p.rep
		}
	}
	if err := sc.Err(); err != nil {
		p.rep.Err = err
		if errors.Is(err, bufio.ErrTooLong) {
			p.lose(ReasonMalformed, "line longer than %d bytes", maxLineBytes)
			p.rep.Total = time.Since(start)
			return p.rep
		}
	}
	p.end()
	if p.rep.Terminal == "" {
		p.rep.Total = time.Since(start)
	}
	return p.rep
}

// splitLine is a bufio.SplitFunc for SSE line ends: LF, CRLF or a lone CR.
func splitLine(data []byte, atEOF bool) (int, []byte, error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if data[i] == '\n' {
			return i + 1, data[:i], nil
		}
		switch {
		case i+1 < len(data) && data[i+1] == '\n':
			return i + 2, data[:i], nil
		case i+1 < len(data) || atEOF:
			return i + 1, data[:i], nil
		}
		return 0, nil, nil // a CR at the end: wait to see whether LF follows
	}
	if atEOF {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func endsWithEOL(data []byte) bool {
	return len(data) > 0 && (data[len(data)-1] == '\n' || data[len(data)-1] == '\r')
}

// parser holds the state of one stream between lines.
type parser struct {
	check StreamCheck
	start time.Time
	rep   Report
	next  int // the event id expected next

	// the event being read
	event   string
	data    []byte
	hasData bool
	id      string
	hasID   bool
	pending bool // a field line was read since the last dispatch

	last   time.Time // when the last ping or event arrived, or reading began
	finish string    // FormatOpenAI: the last finish_reason seen
}

// heard notes that a ping or an event arrived now and returns the silence
// before it.
func (p *parser) heard() time.Duration {
	now := time.Now()
	gap := now.Sub(p.last)
	p.last = now
	p.rep.MaxGap = max(p.rep.MaxGap, gap)
	return gap
}

// lose marks the stream lost; the first reason wins.
func (p *parser) lose(reason LostReason, format string, args ...any) {
	if p.rep.Lost {
		return
	}
	p.rep.Lost = true
	p.rep.Reason = reason
	p.rep.Detail = fmt.Sprintf(format, args...)
}

// line handles one line and reports whether checking is over.
func (p *parser) line(line []byte) bool {
	if len(line) == 0 {
		return p.dispatch()
	}
	if line[0] == ':' {
		if p.rep.Terminal != "" {
			p.lose(ReasonAfterTerminal, "comment after %s", p.rep.Terminal)
			return true
		}
		if strings.TrimSpace(string(line[1:])) == "ping" {
			p.rep.Pings++
			p.rep.PingIntervals = append(p.rep.PingIntervals, p.heard())
		}
		return false
	}
	p.pending = true
	field, value, found := bytes.Cut(line, []byte(":"))
	if found {
		value = bytes.TrimPrefix(value, []byte(" "))
	}
	switch string(field) {
	case "event":
		p.event = string(value)
	case "data":
		if p.hasData {
			p.data = append(p.data, '\n')
		}
		p.data = append(p.data, value...)
		p.hasData = true
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			p.id = string(value)
			p.hasID = true
		}
	}
	// retry and unknown fields are ignored, as EventSource does.
	return false
}

// dispatch ends the current event and reports whether checking is over.
func (p *parser) dispatch() bool {
	event, data, hasData, id, hasID, pending := p.event, p.data, p.hasData, p.id, p.hasID, p.pending
	p.event, p.data, p.hasData, p.id, p.hasID, p.pending = "", p.data[:0], false, "", false, false
	if p.rep.Terminal != "" {
		if !pending {
			return false // blank lines alone carry nothing
		}
		if hasData && (event == protocol.EventDone || event == protocol.EventError) {
			p.lose(ReasonDuplicateTerminal, "%s after %s", event, p.rep.Terminal)
		} else {
			p.lose(ReasonAfterTerminal, "event %q after %s", event, p.rep.Terminal)
		}
		return true
	}
	if !hasData {
		return false // EventSource dispatches nothing without data
	}
	p.heard()
	if p.check.Format == FormatOpenAI {
		return p.openAI(event, data)
	}
	switch event {
	case "", "message", protocol.EventReset, protocol.EventDone, protocol.EventError, protocol.EventQueued, protocol.EventRetrying:
		if !p.sequence(event, id, hasID) {
			return true
		}
	}
	switch event {
	case "", "message":
		return p.chunk(data)
	case protocol.EventQueued:
		var v map[string]any
		if err := strictJSON(data, &v); err != nil {
			p.lose(ReasonMalformed, "%s data: %v", event, err)
			return true
		}
		return false
	case protocol.EventReset:
		var r protocol.Reset
		if err := strictJSON(data, &r); err != nil {
			p.lose(ReasonMalformed, "reset data: %v", err)
			return true
		}
		p.rep.Resets++
		p.rep.Content = ""
		return false
	case protocol.EventRetrying:
		var r protocol.Retrying
		if err := strictJSON(data, &r); err != nil || r.Attempt < 1 || r.RetryInSeconds < 0 || r.Reason == "" {
			p.lose(ReasonMalformed, "retrying data %q: want attempt ≥ 1, retry_in_seconds ≥ 0 and a reason", truncate(string(data), 64))
			return true
		}
		p.rep.Retryings++
		return false
	case protocol.EventDone:
		var d protocol.Done
		if err := strictJSON(data, &d); err != nil {
			p.lose(ReasonMalformed, "done data: %v", err)
			return true
		}
		p.rep.Terminal = protocol.EventDone
		p.rep.Done = &d
		p.rep.Total = time.Since(p.start)
		if p.check.Want != nil {
			if want := strings.Join(p.check.Want, ""); p.rep.Content != want {
				p.lose(ReasonContent, "%s", describeDiff(p.rep.Content, want))
				return true
			}
		}
		return false
	case protocol.EventError:
		var pr protocol.Problem
		if err := strictJSON(data, &pr); err != nil {
			p.lose(ReasonMalformed, "error data: %v", err)
			return true
		}
		if pr.Type == "" {
			p.lose(ReasonMalformed, "error data: problem without type")
			return true
		}
		p.rep.Terminal = protocol.EventError
		p.rep.Problem = &pr
		p.rep.Total = time.Since(p.start)
		return false
	}
	p.lose(ReasonMalformed, "unknown event %q", truncate(event, 64))
	return true
}

// openAIChunk is the part of an OpenAI chat.completion.chunk the checker
// reads; other fields are ignored.
type openAIChunk struct {
	Choices []struct {
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *protocol.Usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// openAIErrorType prefixes the problem type recorded for an error object
// in an OpenAI stream.
const openAIErrorType = "openai-error:"

// openAI handles one event of an OpenAI-compatible stream and reports
// whether checking is over.
func (p *parser) openAI(event string, data []byte) bool {
	if event != "" && event != "message" {
		p.lose(ReasonMalformed, "unknown event %q", truncate(event, 64))
		return true
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		p.rep.Terminal = protocol.EventDone
		p.rep.Done = &protocol.Done{FinishReason: p.finish, Path: PathUpstream}
		p.rep.Total = time.Since(p.start)
		if p.check.Want != nil {
			if want := strings.Join(p.check.Want, ""); p.rep.Content != want {
				p.lose(ReasonContent, "%s", describeDiff(p.rep.Content, want))
				return true
			}
		}
		return false
	}
	var c openAIChunk
	if err := strictJSON(data, &c); err != nil {
		p.lose(ReasonMalformed, "event %d data: %v", p.rep.Chunks+1, err)
		return true
	}
	if c.Error != nil {
		typ := c.Error.Type
		if typ == "" {
			typ = "unknown"
		}
		p.rep.Terminal = protocol.EventError
		p.rep.Problem = &protocol.Problem{Type: openAIErrorType + truncate(typ, 64), Title: truncate(c.Error.Message, 128)}
		p.rep.Total = time.Since(p.start)
		return false
	}
	if len(c.Choices) == 0 {
		if c.Usage == nil {
			p.lose(ReasonMalformed, "event %d: neither choices nor usage", p.rep.Chunks+1)
			return true
		}
		return false // the usage chunk of stream_options.include_usage
	}
	ch := c.Choices[0]
	if ch.FinishReason != nil && *ch.FinishReason != "" {
		p.finish = *ch.FinishReason
	}
	if ch.Delta.Content == nil || *ch.Delta.Content == "" {
		return false // the role-only first delta or the finish delta
	}
	if p.rep.Chunks == 0 {
		p.rep.FirstChunk = time.Since(p.start)
	}
	p.rep.Chunks++
	p.rep.Content += *ch.Delta.Content
	if p.check.StopAfter > 0 && p.rep.Chunks >= p.check.StopAfter {
		p.rep.Stopped = true
		return true
	}
	return false
}

// sequence checks an event's id against the next one expected and
// reports whether it is right.
func (p *parser) sequence(event, id string, hasID bool) bool {
	if event == "" || event == "message" {
		event = "chunk"
	}
	if !hasID {
		p.lose(ReasonSequence, "%s without id, want %d", event, p.next)
		return false
	}
	seq, err := strconv.Atoi(id)
	if err != nil || seq != p.next {
		p.lose(ReasonSequence, "%s id %q, want %d", event, truncate(id, 32), p.next)
		return false
	}
	p.rep.LastID = seq
	p.next++
	return true
}

func (p *parser) chunk(data []byte) bool {
	seq := p.next - 1
	var c struct {
		Content *string `json:"content"`
	}
	if err := strictJSON(data, &c); err != nil {
		p.lose(ReasonMalformed, "chunk %d data: %v", seq, err)
		return true
	}
	if c.Content == nil {
		p.lose(ReasonMalformed, "chunk %d data: no content", seq)
		return true
	}
	if p.rep.Chunks == 0 {
		p.rep.FirstChunk = time.Since(p.start)
	}
	p.rep.Chunks++
	p.rep.Content += *c.Content
	if p.check.StopAfter > 0 && p.rep.Chunks >= p.check.StopAfter {
		p.rep.Stopped = true
		return true
	}
	return false
}

// end handles the end of the stream.
func (p *parser) end() {
	if p.rep.Terminal != "" {
		if p.pending {
			p.lose(ReasonAfterTerminal, "partial event after %s", p.rep.Terminal)
		}
		return
	}
	how := "EOF"
	if p.rep.Err != nil {
		how = p.rep.Err.Error()
	}
	p.lose(ReasonNoTerminal, "stream ended (%s) after %d chunks without done or error", how, p.rep.Chunks)
}

// strictJSON decodes one JSON object with nothing after it.
func strictJSON(b []byte, v any) error {
	t := bytes.TrimSpace(b)
	if len(t) == 0 || t[0] != '{' {
		return errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON object")
	}
	return nil
}

// describeDiff says where got departs from want without printing either.
func describeDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("content differs at byte %d (got %d bytes, want %d)", i, len(got), len(want))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
