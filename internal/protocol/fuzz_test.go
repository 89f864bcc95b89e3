package protocol

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// Wire samples as workers and clients send them; the fuzzers start here.
var (
	resultSamples = []string{
		`BATCH:[{"seq":1,"content":"Hel"}]`,
		`BATCH:[{"seq":4,"content":"lo"},{"seq":5,"content":","},{"seq":6,"content":" wor"}]`,
		`BATCH:[{"seq":1,"content":"a \"q\"\n<b>&\r\\ \u2028 🌊"}]`,
		`SIGNAL:DONE`,
		`SIGNAL:DONE:{}`,
		`SIGNAL:DONE:{"request_id":"req-1","finish_reason":"stop","path":"queued","usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`,
		`SIGNAL:ERROR:{"type":"https://spillway.dev/errors/queue-timeout","title":"Queue Timeout","status":503,"detail":"no worker started the request in time","retry_after_seconds":2}`,
		`SIGNAL:HEARTBEAT`,
		`SIGNAL:RESET:{"attempt":2}`,
		`BATCH:3:[{"seq":4,"content":"lo"},{"seq":5,"content":","}]`,
		`SIGNAL:DONE:1:60`,
		`SIGNAL:DONE:12:7:{"request_id":"req-1","finish_reason":"stop"}`,
		`SIGNAL:ERROR:2:{"type":"https://spillway.dev/errors/stream-gap","title":"Stream Gap","status":503}`,
		`SIGNAL:HEARTBEAT:7`,
		`BATCH:01:[{"seq":1,"content":"a"}]`,
		`SIGNAL:DONE:2:5:`,
		`SIGNAL:RETRYING:{"attempt":2,"retry_in_seconds":20,"reason":"throttled"}`,
		`SIGNAL:RETRYING:{"attempt":2,"retry_in_seconds":0.1,"reason":"server_error"}`,
		`SIGNAL:RETRYING:{"attempt":0,"retry_in_seconds":1,"reason":"x"}`,
		`SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":-1,"reason":"x"}`,
		`SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":1,"reason":"a\nb"}`,
		`SIGNAL:RETRYING:4:{"attempt":2,"retry_in_seconds":20,"reason":"throttled"}`,
		`SIGNAL:RETRYING:01:{"attempt":2,"retry_in_seconds":20,"reason":"throttled"}`,
		`BATCH:[{"seq":1,"content":"a"}]]`,
		`SIGNAL:DONE:{}}`,
		`BATCH:[]`,
		``,
	}
	requestSamples = []string{
		`{"messages":[{"role":"user","content":"Hello"}],"model":"sim-1","max_tokens":256,"temperature":0.7,"thread_id":"optional"}`,
		`{"prompt":"Hello"}`,
		`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"tool","content":"t"}]}`,
		`{"prompt":"how do I write \\u0000 in JSON?"}`,
		`{"prompt":"x\u0000"}`,
		`{"prompt":"x","messages":[]}`,
		`{"prompt":"x","max_tokens":1.5,"temperature":2.1}`,
		`{"prompt":"x"}}`,
		`[{"prompt":"x"}]`,
		"{\"prompt\":\"\xff\"}",
	}
)

func FuzzDecodeResult(f *testing.F) {
	for _, s := range resultSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		r, err := DecodeResult(msg)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeResult error %v does not wrap ErrMalformed", err)
			}
			return
		}
		checkResult(t, r)
		enc, err := EncodeResult(r)
		if err != nil {
			// Re-encoding may grow a message that was near the limit
			// (invalid UTF-8 becomes U+FFFD); nothing else may fail.
			if len(msg)*3 > MaxResultBytes {
				return
			}
			t.Fatalf("EncodeResult(DecodeResult(%q)): %v", msg, err)
		}
		again, err := DecodeResult(enc)
		if err != nil {
			t.Fatalf("DecodeResult(EncodeResult(r)) of %q: %v (encoded %q)", msg, err, enc)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("round trip changed the result:\n first %+v\nsecond %+v\n(input %q, encoded %q)", r, again, msg, enc)
		}
	})
}

// checkResult checks what a successful DecodeResult promises.
func checkResult(tb testing.TB, r Result) {
	tb.Helper()
	if r.Attempt < 0 || r.Attempt > MaxAttempt || r.Count < 0 || r.Count > MaxCount || (r.Attempt == 0 && r.Count != 0) {
		tb.Fatalf("attempt %d or count %d out of range", r.Attempt, r.Count)
	}
	if r.Count != 0 && r.Kind != KindDone {
		tb.Fatalf("%s carries a count", r.Kind)
	}
	switch r.Kind {
	case KindBatch:
		if len(r.Chunks) == 0 || r.Chunks[0].Seq < 1 {
			tb.Fatalf("batch %+v: empty or starts below seq 1", r.Chunks)
		}
		for i := 1; i < len(r.Chunks); i++ {
			if r.Chunks[i].Seq != r.Chunks[i-1].Seq+1 {
				tb.Fatalf("batch %+v: seq not contiguous at %d", r.Chunks, i)
			}
		}
		if r.Done != nil || r.Problem != nil || r.Reset != nil || r.Retrying != nil {
			tb.Fatalf("batch result carries other payloads: %+v", r)
		}
	case KindDone:
		if r.Chunks != nil || r.Problem != nil || r.Reset != nil || r.Retrying != nil {
			tb.Fatalf("done result carries other payloads: %+v", r)
		}
	case KindError:
		if r.Problem == nil || r.Problem.Type == "" || r.Problem.Status < 400 || r.Problem.Status > 599 {
			tb.Fatalf("error result with bad problem: %+v", r.Problem)
		}
	case KindHeartbeat:
		if !reflect.DeepEqual(r, Result{Kind: KindHeartbeat, Attempt: r.Attempt}) {
			tb.Fatalf("heartbeat carries payloads: %+v", r)
		}
	case KindReset:
		if r.Reset == nil || r.Reset.Attempt < 1 || r.Attempt != r.Reset.Attempt {
			tb.Fatalf("reset with bad payload: %+v", r.Reset)
		}
	case KindRetrying:
		rt := r.Retrying
		if rt == nil || rt.Attempt < 1 || rt.RetryInSeconds < 0 || rt.RetryInSeconds > MaxRetryInSeconds || rt.Reason == "" ||
			strings.ContainsAny(rt.Reason, "\r\n\x00\"") || r.Chunks != nil || r.Problem != nil || r.Reset != nil || r.Done != nil {
			tb.Fatalf("retrying with bad payload: %+v", r)
		}
	default:
		tb.Fatalf("decoded unknown kind %d", r.Kind)
	}
}

func FuzzDecodeJob(f *testing.F) {
	f.Add([]byte(sampleJobWire))
	f.Add([]byte(`{"v":1,"request_id":"r1","user_id":"10.0.0.1","payload":{"messages":[{"role":"user","content":"Hi <b> & \"you\"\n"}]},` +
		`"enqueue_time":"2025-01-02T03:04:05Z","deadline":"2025-01-02T03:04:35+05:30"}`))
	f.Add([]byte(sampleJobWire + `}`))
	f.Add([]byte(strings.Replace(sampleJobWire, `"v":2`, `"v":1`, 1)))
	f.Add([]byte(strings.Replace(sampleJobWire, `"v":2`, `"v":3`, 1)))
	f.Add([]byte(`null`))
	// Trace fields, valid and not: a bad one must never fail the job.
	f.Add([]byte(sampleTracedJobWire))
	for _, trace := range []string{
		`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		`{"traceparent":"00-00000000000000000000000000000000-0000000000000000-01"}`,
		`{"traceparent":"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"}`,
		`{"traceparent":"junk
","tracestate":"a=b","baggage":"k=v"}`,
		`{"traceparent":7}`, `[]`, `"x"`, `null`, `{}`, `{"tracestate":"` + strings.Repeat("a", MaxTraceStateBytes+1) + `"}`,
	} {
		f.Add([]byte(strings.TrimSuffix(sampleJobWire, `}`) + `,"trace":` + trace + `}`))
	}
	// Priorities, known and not.
	for _, prio := range []string{`"high"`, `"normal"`, `"low"`, `""`, `"urgent"`, `2`, `null`} {
		f.Add([]byte(strings.TrimSuffix(sampleJobWire, `}`) + `,"priority":` + prio + `}`))
	}
	// Session ids, valid and not.
	for _, sid := range []string{`"conv-42"`, `""`, `"a b"`, `"` + strings.Repeat("s", 129) + `"`, `7`} {
		f.Add([]byte(strings.TrimSuffix(sampleJobWire, `}`) + `,"session_id":` + sid + `}`))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		j, err := DecodeJob(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeJob error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if (j.Version != 1 && j.Version != JobVersion) || !validIDChars(j.RequestID) || j.RequestID == "" || len(j.RequestID) > 128 {
			t.Fatalf("DecodeJob accepted version %d request_id %q", j.Version, j.RequestID)
		}
		if j.EnqueueTime.IsZero() || j.Deadline.IsZero() {
			t.Fatalf("DecodeJob accepted zero times: %+v", j)
		}
		checkMessages(t, j.Payload.Messages, maxMessagesHardLimit)
		if _, err := ParsePriority(string(j.Priority)); j.Priority != "" && err != nil {
			t.Fatalf("DecodeJob accepted priority %q", j.Priority)
		}
		if j.SessionID != "" && !ValidUserID(j.SessionID) {
			t.Fatalf("DecodeJob accepted session_id %q", j.SessionID)
		}
		if j.Trace != nil {
			if j.TraceDropped || j.Trace.IsZero() || j.Trace.Validate() != nil {
				t.Fatalf("DecodeJob kept trace %+v (dropped %v)", *j.Trace, j.TraceDropped)
			}
		}
		enc, err := EncodeJob(j)
		if err != nil {
			if len(b)*3 > MaxJobBytes {
				return
			}
			t.Fatalf("EncodeJob(DecodeJob(%q)): %v", b, err)
		}
		again, err := DecodeJob(enc)
		if err != nil {
			t.Fatalf("DecodeJob(EncodeJob(j)) of %q: %v (encoded %q)", b, err, enc)
		}
		// A dropped trace field is gone from the re-encoded job, so the
		// second decode has nothing left to drop.
		// A version 1 job is written again as the current version.
		j.Version = again.Version
		if !jobsEqual(again, withoutTraceDropped(j)) {
			t.Fatalf("round trip changed the job:\n first %+v\nsecond %+v\n(input %q, encoded %q)", j, again, b, enc)
		}
	})
}

func FuzzDecodeChatRequest(f *testing.F) {
	for _, s := range requestSamples {
		f.Add([]byte(s), 1000, 32768)
	}
	f.Add([]byte(`{"messages":[{"role":"user","content":"1"},{"role":"user","content":"2"}],"max_tokens":3}`), 1, 2)
	f.Fuzz(func(t *testing.T, body []byte, maxMessages, maxTokens int) {
		lim := Limits{MaxMessages: maxMessages, MaxTokens: maxTokens}
		req, err := DecodeChatRequest(body, lim)
		if err != nil {
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("DecodeChatRequest error %v does not wrap ErrInvalidRequest", err)
			}
			if len(err.Error()) > 200 {
				t.Fatalf("error text is %d bytes, it must not carry the input: %q", len(err.Error()), err)
			}
			return
		}
		checkMessages(t, req.Messages, lim.MaxMessages)
		if req.MaxTokens != 0 && (req.MaxTokens < 1 || req.MaxTokens > lim.MaxTokens) {
			t.Fatalf("max_tokens %d outside 1..%d", req.MaxTokens, lim.MaxTokens)
		}
		if req.Temperature != nil && !(*req.Temperature >= 0 && *req.Temperature <= 2) {
			t.Fatalf("temperature %v outside 0..2", *req.Temperature)
		}
		if len(req.Model) > 256 || len(req.ThreadID) > 128 {
			t.Fatalf("model of %d or thread_id of %d bytes accepted", len(req.Model), len(req.ThreadID))
		}
		for _, s := range []string{req.Model, req.ThreadID} {
			if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
				t.Fatalf("accepted NUL or invalid UTF-8 in %q", s)
			}
		}
		// What the api accepted, a worker must accept as a job.
		if len(body) < MaxJobBytes/8 {
			j := sampleJob()
			j.Payload, j.ThreadID = req, req.ThreadID
			enc, err := EncodeJob(j)
			if err != nil {
				t.Fatalf("EncodeJob of an accepted request: %v", err)
			}
			back, err := DecodeJob(enc)
			if err != nil {
				t.Fatalf("DecodeJob of an accepted request %q: %v", body, err)
			}
			if !reflect.DeepEqual(back.Payload, req) {
				t.Fatalf("accepted request changed on the queue:\n got %+v\nwant %+v", back.Payload, req)
			}
		}
	})
}

// checkMessages checks the invariants every accepted message list holds.
func checkMessages(tb testing.TB, msgs []Message, max int) {
	tb.Helper()
	if len(msgs) < 1 || len(msgs) > max {
		tb.Fatalf("accepted %d messages, want 1..%d", len(msgs), max)
	}
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool", "function":
		default:
			tb.Fatalf("messages[%d] has role %q", i, m.Role)
		}
		if strings.IndexByte(m.Content, 0) >= 0 {
			tb.Fatalf("messages[%d] content holds NUL", i)
		}
		if !utf8.ValidString(m.Content) {
			tb.Fatalf("messages[%d] content is not valid UTF-8", i)
		}
	}
}

// FuzzAppendIDEvent: any content, encoded as JSON the way the relays
// encode it, makes one frame of one id, one data line and a blank line,
// and parses back to itself.
func FuzzAppendIDEvent(f *testing.F) {
	for _, s := range []string{"", "Hel", "a\nb\r\nc\rd", "\n\nevent: done\ndata: {}\nid: 9\n\n", "a\x00b", "\u2028\u2029"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		data, err := json.Marshal(map[string]string{"content": content})
		if err != nil {
			t.Fatal(err)
		}
		out := AppendIDEvent(nil, 7, "", data)
		ev := checkFrames(t, out)
		if len(ev) != 1 || ev[0].id != "7" || strings.Count(string(out), "\n") != 3 {
			t.Fatalf("content %q made %q, want one id line, one data line and a blank line", content, out)
		}
		var back map[string]string
		if err := json.Unmarshal([]byte(ev[0].data), &back); err != nil || back["content"] != strings.ToValidUTF8(content, "\uFFFD") {
			t.Fatalf("content %q parsed back as %q (%v)", content, back["content"], err)
		}
	})
}
