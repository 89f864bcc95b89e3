package protocol

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

// sampleJob returns a job that DecodeJob accepts.
func sampleJob() Job {
	enq := time.Date(2025, 3, 14, 15, 9, 26, 535897000, time.UTC)
	return Job{
		Version:   JobVersion,
		RequestID: "req-01J9Z8",
		UserID:    "alice@example.com",
		ThreadID:  "t-42",
		Payload: ChatRequest{
			Messages: []Message{
				{Role: "system", Content: "Be brief."},
				{Role: "user", Content: "Hello"},
			},
			Model:       "sim-1",
			MaxTokens:   256,
			Temperature: ptr(0.7),
			ThreadID:    "t-42",
		},
		EnqueueTime: enq,
		Deadline:    enq.Add(30 * time.Second),
	}
}

const sampleJobWire = `{"v":2,"request_id":"req-01J9Z8","user_id":"alice@example.com","thread_id":"t-42",` +
	`"payload":{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],` +
	`"model":"sim-1","max_tokens":256,"temperature":0.7,"thread_id":"t-42"},` +
	`"enqueue_time":"2025-03-14T15:09:26.535897Z","deadline":"2025-03-14T15:09:56.535897Z"}`

func TestEncodeJobGolden(t *testing.T) {
	t.Parallel()
	minimal := Job{
		RequestID:   "r1",
		UserID:      "10.0.0.1",
		Payload:     ChatRequest{Messages: []Message{{Role: "user", Content: "Hi <b> & \"you\"\n"}}},
		EnqueueTime: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Deadline:    time.Date(2025, 1, 2, 3, 4, 35, 0, time.UTC),
	}
	tests := []struct {
		name string
		in   Job
		want string
	}{
		{"full", sampleJob(), sampleJobWire},
		{
			// Version is stamped by EncodeJob whatever the caller set.
			"minimal", minimal,
			`{"v":2,"request_id":"r1","user_id":"10.0.0.1","payload":{"messages":[{"role":"user","content":"Hi <b> & \"you\"\n"}]},` +
				`"enqueue_time":"2025-01-02T03:04:05Z","deadline":"2025-01-02T03:04:35Z"}`,
		},
		{
			"temperature zero is kept", func() Job { j := minimal; j.Payload.Temperature = ptr(0.0); return j }(),
			`{"v":2,"request_id":"r1","user_id":"10.0.0.1","payload":{"messages":[{"role":"user","content":"Hi <b> & \"you\"\n"}],"temperature":0},` +
				`"enqueue_time":"2025-01-02T03:04:05Z","deadline":"2025-01-02T03:04:35Z"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := EncodeJob(tt.in)
			if err != nil {
				t.Fatalf("EncodeJob: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("EncodeJob =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func TestDecodeJobGolden(t *testing.T) {
	t.Parallel()
	got, err := DecodeJob([]byte(sampleJobWire))
	if err != nil {
		t.Fatalf("DecodeJob: %v", err)
	}
	if want := sampleJob(); !jobsEqual(got, want) {
		t.Errorf("DecodeJob =\n%+v\nwant\n%+v", got, want)
	}
}

// jobsEqual compares jobs with time.Time.Equal, since a decoded time keeps
// the zone offset of its text rather than the *Location it was made with.
func jobsEqual(a, b Job) bool {
	if !a.EnqueueTime.Equal(b.EnqueueTime) || !a.Deadline.Equal(b.Deadline) {
		return false
	}
	a.EnqueueTime, b.EnqueueTime = time.Time{}, time.Time{}
	a.Deadline, b.Deadline = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

func TestJobRoundTrip(t *testing.T) {
	t.Parallel()
	tests := map[string]func(*Job){
		"sample": func(*Job) {},
		"unicode": func(j *Job) {
			j.Payload.Messages = []Message{{Role: "user", Content: "Grüße aus Köln — 日本語 — 🦀🚀 — \u2028\u2029"}}
		},
		"newlines and quotes": func(j *Job) {
			j.Payload.Messages = []Message{
				{Role: "user", Content: "line 1\nline 2\r\n\"quoted\" 'single' \\back\\ \t tab"},
				{Role: "assistant", Content: "data: x\n\nevent: done\n"},
				{Role: "tool", Content: `{"json":"inside","n":[1,2]}`},
			}
		},
		"html characters": func(j *Job) { j.Payload.Messages[1].Content = "<script>alert(1)</script> & more" },
		"no optional fields": func(j *Job) {
			j.ThreadID, j.UserID = "", ""
			j.Payload = ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}}
		},
		"temperature zero": func(j *Job) { j.Payload.Temperature = ptr(0.0) },
		"temperature two":  func(j *Job) { j.Payload.Temperature = ptr(2.0) },
		"request id of every allowed char": func(j *Job) {
			j.RequestID = "AZaz09._:@-"
		},
		"request id of 128 chars":         func(j *Job) { j.RequestID = strings.Repeat("r", 128) },
		"trace context":                   func(j *Job) { *j = sampleTracedJob() },
		"priority high":                   func(j *Job) { j.Priority = PriorityHigh },
		"priority low":                    func(j *Job) { j.Priority = PriorityLow },
		"session id":                      func(j *Job) { j.SessionID = "conv-42:user@example.com" },
		"trace context with baggage only": func(j *Job) { j.Trace = &TraceContext{Baggage: "k=v;meta, k2 = v2"} },
		"non utc times": func(j *Job) {
			loc := time.FixedZone("", 5*3600+30*60)
			j.EnqueueTime = time.Date(2025, 6, 1, 12, 0, 0, 1, loc)
			j.Deadline = j.EnqueueTime.Add(time.Minute)
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := sampleJob()
			mutate(&in)
			b, err := EncodeJob(in)
			if err != nil {
				t.Fatalf("EncodeJob: %v", err)
			}
			got, err := DecodeJob(b)
			if err != nil {
				t.Fatalf("DecodeJob(%s): %v", b, err)
			}
			if !jobsEqual(got, in) {
				t.Errorf("round trip of %s:\n got %+v\nwant %+v", b, got, in)
			}
		})
	}
}

// A job written before priorities existed has none and is read as
// normal; one with a priority carries it on the wire.
func TestJobPriorityWire(t *testing.T) {
	t.Parallel()
	old, err := DecodeJob([]byte(sampleJobWire))
	if err != nil {
		t.Fatalf("DecodeJob: %v", err)
	}
	if old.Priority != "" || old.Priority.OrNormal() != PriorityNormal {
		t.Errorf("job without priority: %q (OrNormal %q), want empty and normal", old.Priority, old.Priority.OrNormal())
	}
	j := sampleJob()
	j.Priority = PriorityLow
	b, err := EncodeJob(j)
	if err != nil {
		t.Fatalf("EncodeJob: %v", err)
	}
	if want := strings.TrimSuffix(sampleJobWire, `}`) + `,"priority":"low"}`; string(b) != want {
		t.Errorf("EncodeJob with priority:\n got %s\nwant %s", b, want)
	}
}

func TestPriority(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "HIGH", "urgent", " high", "normal\n"} {
		if p, err := ParsePriority(s); err == nil {
			t.Errorf("ParsePriority(%q) = %q, want error", s, p)
		}
	}
	tests := []struct{ ask, ceiling, want Priority }{
		{PriorityHigh, PriorityNormal, PriorityNormal},
		{PriorityHigh, PriorityHigh, PriorityHigh},
		{PriorityNormal, PriorityLow, PriorityLow},
		{PriorityLow, PriorityHigh, PriorityLow},
		{"", PriorityHigh, PriorityNormal},
		{"", PriorityLow, PriorityLow},
	}
	for _, tt := range tests {
		if got := tt.ask.AtMost(tt.ceiling); got != tt.want {
			t.Errorf("%q.AtMost(%q) = %q, want %q", tt.ask, tt.ceiling, got, tt.want)
		}
	}
	for i, p := range Priorities {
		if got, err := ParsePriority(string(p)); err != nil || got != p || p.Rank() != i {
			t.Errorf("ParsePriority(%q) = %q, %v; rank %d, want %d", p, got, err, p.Rank(), i)
		}
	}
}

// A job's place in line: high a period earlier, low a period later, so a
// low job that waited two periods stands with a high one just enqueued.
func TestPlaceInLine(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	const aging = 30 * time.Second
	for _, tt := range []struct {
		p    Priority
		want time.Time
	}{
		{PriorityHigh, t0.Add(-aging)},
		{PriorityNormal, t0},
		{"", t0},
		{PriorityLow, t0.Add(aging)},
	} {
		if got := PlaceInLine(t0, tt.p, aging); !got.Equal(tt.want) {
			t.Errorf("PlaceInLine(%q) = %s, want %s", tt.p, got, tt.want)
		}
	}
	if !PlaceInLine(t0.Add(-2*aging), PriorityLow, aging).Equal(PlaceInLine(t0, PriorityHigh, aging)) {
		t.Error("a low job two periods older does not stand with a fresh high one")
	}
}

func TestDecodeJobRejects(t *testing.T) {
	t.Parallel()
	// edit replaces the first occurrence of old in sampleJobWire.
	edit := func(old, new string) string {
		if !strings.Contains(sampleJobWire, old) {
			panic(fmt.Sprintf("sample job has no %q", old))
		}
		return strings.Replace(sampleJobWire, old, new, 1)
	}
	hugeContent := strings.Repeat("a", MaxJobBytes)
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ``},
		{"not json", `v=1`},
		{"array", `[` + sampleJobWire + `]`},
		{"null", `null`},
		{"truncated", sampleJobWire[:len(sampleJobWire)-1]},
		{"trailing value", sampleJobWire + ` {}`},
		{"trailing brace", sampleJobWire + `}`},
		{"trailing bracket", sampleJobWire + `]`},
		{"trailing garbage", sampleJobWire + `xyz`},
		{"version missing", edit(`"v":2,`, ``)},
		{"version 0", edit(`"v":2`, `"v":0`)},
		{"version 3", edit(`"v":2`, `"v":3`)},
		{"version string", edit(`"v":2`, `"v":"2"`)},
		{"request_id missing", edit(`"request_id":"req-01J9Z8",`, ``)},
		{"request_id empty", edit(`"req-01J9Z8"`, `""`)},
		{"request_id space", edit(`"req-01J9Z8"`, `"req 1"`)},
		{"request_id slash", edit(`"req-01J9Z8"`, `"req/1"`)},
		{"request_id newline", edit(`"req-01J9Z8"`, `"req\n1"`)},
		{"request_id unicode", edit(`"req-01J9Z8"`, `"réq"`)},
		{"request_id brace", edit(`"req-01J9Z8"`, `"{req}"`)},
		{"request_id 129 chars", edit(`"req-01J9Z8"`, `"`+strings.Repeat("r", 129)+`"`)},
		{"request_id number", edit(`"req-01J9Z8"`, `7`)},
		{"deadline missing", edit(`,"deadline":"2025-03-14T15:09:56.535897Z"`, ``)},
		{"deadline zero", edit(`"deadline":"2025-03-14T15:09:56.535897Z"`, `"deadline":"0001-01-01T00:00:00Z"`)},
		{"deadline not a time", edit(`"deadline":"2025-03-14T15:09:56.535897Z"`, `"deadline":"tomorrow"`)},
		{"enqueue_time missing", edit(`"enqueue_time":"2025-03-14T15:09:26.535897Z",`, ``)},
		{"payload missing", edit(`"payload":{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],`+
			`"model":"sim-1","max_tokens":256,"temperature":0.7,"thread_id":"t-42"},`, ``)},
		{"messages empty", edit(`"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}]`, `"messages":[]`)},
		{"messages null", edit(`"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}]`, `"messages":null`)},
		{"role bad", edit(`"role":"system"`, `"role":"root"`)},
		{"role upper case", edit(`"role":"system"`, `"role":"System"`)},
		{"role empty", edit(`"role":"system"`, `"role":""`)},
		{"content NUL", edit(`"content":"Hello"`, `"content":"Hel\u0000lo"`)},
		{"content number", edit(`"content":"Hello"`, `"content":5`)},
		{"priority unknown", strings.TrimSuffix(sampleJobWire, `}`) + `,"priority":"urgent"}`},
		{"session_id space", strings.TrimSuffix(sampleJobWire, `}`) + `,"session_id":"conv 42"}`},
		{"session_id 129 chars", strings.TrimSuffix(sampleJobWire, `}`) + `,"session_id":"` + strings.Repeat("s", 129) + `"}`},
		{"session_id number", strings.TrimSuffix(sampleJobWire, `}`) + `,"session_id":42}`},
		{"priority upper case", strings.TrimSuffix(sampleJobWire, `}`) + `,"priority":"HIGH"}`},
		{"priority number", strings.TrimSuffix(sampleJobWire, `}`) + `,"priority":2}`},
		{"oversized", edit(`"content":"Hello"`, `"content":"`+hugeContent+`"`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeJob([]byte(tt.in))
			if err == nil {
				t.Fatalf("DecodeJob(%.100q) = %+v, want error", tt.in, got)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("DecodeJob error %v does not wrap ErrMalformed", err)
			}
			if len(err.Error()) > 512 {
				t.Errorf("DecodeJob error is %d bytes long; it must not carry the input: %.100s…", len(err.Error()), err)
			}
		})
	}
}

func TestEncodeJobRejectsOversized(t *testing.T) {
	t.Parallel()
	j := sampleJob()
	// '<' was 6 bytes on the wire with HTML escaping; plain text well
	// under MaxJobBytes must still encode to at most MaxJobBytes.
	j.Payload.Messages[1].Content = strings.Repeat("<", MaxJobBytes/2)
	b, err := EncodeJob(j)
	if err != nil {
		t.Fatalf("EncodeJob of a %d-byte message: %v", MaxJobBytes/2, err)
	}
	if _, err := DecodeJob(b); err != nil {
		t.Fatalf("DecodeJob(EncodeJob(j)) of a %d-byte message: %v", MaxJobBytes/2, err)
	}

	j.Payload.Messages[1].Content = strings.Repeat("x", MaxJobBytes)
	if _, err := EncodeJob(j); err == nil {
		t.Fatal("EncodeJob of a job larger than MaxJobBytes succeeded; DecodeJob would refuse it")
	}
}

func TestValidUserID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want bool
	}{
		{"a", true},
		{strings.Repeat("a", 128), true},
		{"", false},
		{strings.Repeat("a", 129), false},
		{"Z", true},
		{"0", true},
		{"9", true},
		{".", true},
		{"_", true},
		{":", true},
		{"@", true},
		{"-", true},
		{"user.name_1:team@example-corp", true},
		{"2001:db8::1", true},
		{"203.0.113.7", true},
		{"a b", false},
		{" a", false},
		{"a/b", false},
		{"a\\b", false},
		{"ä", false},
		{"用户", false},
		{"a\n", false},
		{"a\r", false},
		{"a\x00", false},
		{"a\t", false},
		{"a+b", false},
		{"a%20", false},
		{"a{b}", false},
		{"a*", false},
		{"a,b", false},
		{"a;b", false},
		{"a=b", false},
		{"a'b", false},
		{"a\"b", false},
		{"\xff", false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%.20q", tt.in), func(t *testing.T) {
			t.Parallel()
			if got := ValidUserID(tt.in); got != tt.want {
				t.Errorf("ValidUserID(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// A field this version does not know is ignored, so a consumer keeps
// taking the jobs of a newer api during a rolling upgrade as long as the
// version stays (a field an old consumer must not ignore bumps it).
func TestDecodeJobIgnoresUnknownFields(t *testing.T) {
	b := []byte(strings.TrimSuffix(sampleJobWire, `}`) + `,"added_later":{"x":[1,2]}}`)
	j, err := DecodeJob(b)
	if err != nil {
		t.Fatalf("DecodeJob with an unknown field: %v", err)
	}
	want, err := DecodeJob([]byte(sampleJobWire))
	if err != nil {
		t.Fatal(err)
	}
	if j.RequestID != want.RequestID || len(j.Payload.Messages) != len(want.Payload.Messages) {
		t.Fatalf("decoded %+v, want %+v", j, want)
	}
}
