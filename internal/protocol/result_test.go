package protocol

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestEncodeResultGolden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   Result
		want string
	}{
		{
			name: "batch of one",
			in:   Result{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: "Hel"}}},
			want: `BATCH:[{"seq":1,"content":"Hel"}]`,
		},
		{
			name: "batch of three",
			in:   Result{Kind: KindBatch, Chunks: []Chunk{{Seq: 4, Content: "lo"}, {Seq: 5, Content: ","}, {Seq: 6, Content: " wor"}}},
			want: `BATCH:[{"seq":4,"content":"lo"},{"seq":5,"content":","},{"seq":6,"content":" wor"}]`,
		},
		{
			name: "batch escapes quotes and line breaks but not html",
			in:   Result{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: "a \"q\"\n<b>&\r\\"}}},
			want: `BATCH:[{"seq":1,"content":"a \"q\"\n<b>&\r\\"}]`,
		},
		{
			name: "done without payload",
			in:   Result{Kind: KindDone},
			want: `SIGNAL:DONE`,
		},
		{
			name: "done with payload",
			in: Result{Kind: KindDone, Done: &Done{
				RequestID: "req-1", FinishReason: "stop", Path: "queued",
				Usage: &Usage{PromptTokens: 3, CompletionTokens: 5, TotalTokens: 8},
			}},
			want: `SIGNAL:DONE:{"request_id":"req-1","finish_reason":"stop","path":"queued","usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`,
		},
		{
			name: "done with empty payload",
			in:   Result{Kind: KindDone, Done: &Done{}},
			want: `SIGNAL:DONE:{}`,
		},
		{
			name: "error",
			in: Result{Kind: KindError, Problem: (&Problem{Type: ProblemTypeBase + ProblemQueueTimeout, Title: "Queue Timeout", Status: 503,
				Detail: "no worker started the request in time"}).WithRetryAfter(2)},
			want: `SIGNAL:ERROR:{"type":"https://spillway.dev/errors/queue-timeout","title":"Queue Timeout","status":503,"detail":"no worker started the request in time","retry_after_seconds":2}`,
		},
		{
			name: "error minimal",
			in:   Result{Kind: KindError, Problem: &Problem{Type: ProblemTypeBase + ProblemWorkerLost, Status: 502}},
			want: `SIGNAL:ERROR:{"type":"https://spillway.dev/errors/worker-lost","title":"","status":502}`,
		},
		{
			name: "heartbeat",
			in:   Result{Kind: KindHeartbeat},
			want: `SIGNAL:HEARTBEAT`,
		},
		{
			name: "reset",
			in:   Result{Kind: KindReset, Attempt: 2, Reset: &Reset{Attempt: 2}},
			want: `SIGNAL:RESET:{"attempt":2}`,
		},
		{
			name: "fenced batch",
			in:   Result{Kind: KindBatch, Attempt: 3, Chunks: []Chunk{{Seq: 4, Content: "lo"}, {Seq: 5, Content: ","}}},
			want: `BATCH:3:[{"seq":4,"content":"lo"},{"seq":5,"content":","}]`,
		},
		{
			name: "fenced done without payload",
			in:   Result{Kind: KindDone, Attempt: 1, Count: 60},
			want: `SIGNAL:DONE:1:60`,
		},
		{
			name: "fenced done of an empty answer",
			in:   Result{Kind: KindDone, Attempt: 2, Count: 0, Done: &Done{FinishReason: "stop"}},
			want: `SIGNAL:DONE:2:0:{"finish_reason":"stop"}`,
		},
		{
			name: "fenced done with payload",
			in: Result{Kind: KindDone, Attempt: 12, Count: 7, Done: &Done{
				RequestID: "req-1", FinishReason: "stop", Path: "queued",
				Usage: &Usage{PromptTokens: 3, CompletionTokens: 7, TotalTokens: 10},
			}},
			want: `SIGNAL:DONE:12:7:{"request_id":"req-1","finish_reason":"stop","path":"queued","usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`,
		},
		{
			name: "fenced error",
			in:   Result{Kind: KindError, Attempt: 2, Problem: &Problem{Type: ProblemTypeBase + ProblemStreamGap, Title: "Stream Gap", Status: 503}},
			want: `SIGNAL:ERROR:2:{"type":"https://spillway.dev/errors/stream-gap","title":"Stream Gap","status":503}`,
		},
		{
			name: "fenced heartbeat",
			in:   Result{Kind: KindHeartbeat, Attempt: 999999999},
			want: `SIGNAL:HEARTBEAT:999999999`,
		},
		{
			name: "retrying",
			in:   Result{Kind: KindRetrying, Retrying: &Retrying{Attempt: 2, RetryInSeconds: 20, Reason: "throttled"}},
			want: `SIGNAL:RETRYING:{"attempt":2,"retry_in_seconds":20,"reason":"throttled"}`,
		},
		{
			name: "retrying within a second",
			in:   Result{Kind: KindRetrying, Retrying: &Retrying{Attempt: 3, RetryInSeconds: 0.15, Reason: "server_error"}},
			want: `SIGNAL:RETRYING:{"attempt":3,"retry_in_seconds":0.15,"reason":"server_error"}`,
		},
		{
			name: "fenced retrying",
			in:   Result{Kind: KindRetrying, Attempt: 1, Retrying: &Retrying{Attempt: 2, RetryInSeconds: 20, Reason: "throttled"}},
			want: `SIGNAL:RETRYING:1:{"attempt":2,"retry_in_seconds":20,"reason":"throttled"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := EncodeResult(tt.in)
			if err != nil {
				t.Fatalf("EncodeResult: %v", err)
			}
			if string(got) != tt.want {
				t.Errorf("EncodeResult =\n%s\nwant\n%s", got, tt.want)
			}
			back, err := DecodeResult([]byte(tt.want))
			if err != nil {
				t.Fatalf("DecodeResult(golden): %v", err)
			}
			if !reflect.DeepEqual(back, tt.in) {
				t.Errorf("DecodeResult(golden) = %+v, want %+v", back, tt.in)
			}
		})
	}
}

func TestResultRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []Result{
		{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: "héllo wörld 你好 🌊"}}},
		{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: "line1\nline2\r\nline3\rend"}, {Seq: 2, Content: `"quoted" \ back\slash`}}},
		{Kind: KindBatch, Chunks: []Chunk{{Seq: 7, Content: "data: injected\n\nevent: done\n"}, {Seq: 8, Content: "\t\u2028\u2029\x01"}}},
		{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: ""}}},
		{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: "SIGNAL:DONE"}, {Seq: 2, Content: "BATCH:[]"}}},
		{Kind: KindDone},
		{Kind: KindDone, Done: &Done{RequestID: "r:1@x", FinishReason: "length"}},
		{Kind: KindDone, Done: &Done{Usage: &Usage{}}},
		{Kind: KindError, Problem: &Problem{
			Type: ProblemTypeBase + ProblemProviderError, Title: "Provider Error", Status: 502,
			Detail: "l'upstream a répondu «non»\nligne 2", Instance: "/v1/stream/req-9", RetryAfterSeconds: 30,
		}},
		{Kind: KindHeartbeat},
		{Kind: KindReset, Attempt: 1, Reset: &Reset{Attempt: 1}},
		{Kind: KindReset, Attempt: 99, Reset: &Reset{Attempt: 99}},
		{Kind: KindBatch, Attempt: 1, Chunks: []Chunk{{Seq: 1, Content: "SIGNAL:DONE:1:1"}}},
		{Kind: KindDone, Attempt: 5, Count: 1},
		{Kind: KindDone, Attempt: 5, Count: 3, Done: &Done{Usage: &Usage{}}},
		{Kind: KindError, Attempt: 7, Problem: &Problem{Type: "t", Status: 503}},
		{Kind: KindHeartbeat, Attempt: 1},
		{Kind: KindRetrying, Retrying: &Retrying{Attempt: 1, RetryInSeconds: 0, Reason: "circuit_open"}},
		{Kind: KindRetrying, Retrying: &Retrying{Attempt: 6, RetryInSeconds: MaxRetryInSeconds, Reason: "timeout"}},
		{Kind: KindRetrying, Attempt: 3, Retrying: &Retrying{Attempt: 2, RetryInSeconds: 0.5, Reason: "throttled"}},
	}
	for _, in := range tests {
		t.Run(in.Kind.String(), func(t *testing.T) {
			t.Parallel()
			b, err := EncodeResult(in)
			if err != nil {
				t.Fatalf("EncodeResult(%+v): %v", in, err)
			}
			got, err := DecodeResult(b)
			if err != nil {
				t.Fatalf("DecodeResult(%s): %v", b, err)
			}
			if !reflect.DeepEqual(got, in) {
				t.Errorf("round trip of %s:\n got %+v\nwant %+v", b, got, in)
			}
		})
	}
}

func TestDecodeResultRejects(t *testing.T) {
	t.Parallel()
	huge := `BATCH:[{"seq":1,"content":"` + strings.Repeat("a", MaxResultBytes) + `"}]`
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ``},
		{"unknown prefix", `CHUNK:[{"seq":1,"content":"a"}]`},
		{"lower case prefix", `batch:[{"seq":1,"content":"a"}]`},
		{"leading space", ` SIGNAL:HEARTBEAT`},
		{"signal unknown", `SIGNAL:CANCEL`},
		{"done with suffix", `SIGNAL:DONEX`},
		{"heartbeat with suffix", `SIGNAL:HEARTBEAT:{}`},
		{"heartbeat with newline", "SIGNAL:HEARTBEAT\n"},
		{"batch bad json", `BATCH:[{"seq":1,"content":"a"}`},
		{"batch not an array", `BATCH:{"seq":1,"content":"a"}`},
		{"batch null", `BATCH:null`},
		{"batch trailing value", `BATCH:[{"seq":1,"content":"a"}] [1]`},
		{"batch trailing bracket", `BATCH:[{"seq":1,"content":"a"}]]`},
		{"batch trailing brace", `BATCH:[{"seq":1,"content":"a"}]}`},
		{"batch trailing garbage", `BATCH:[{"seq":1,"content":"a"}]xyz`},
		{"batch trailing comma", `BATCH:[{"seq":1,"content":"a"}],`},
		{"batch empty", `BATCH:[]`},
		{"batch seq 0", `BATCH:[{"seq":0,"content":"a"}]`},
		{"batch seq missing", `BATCH:[{"content":"a"}]`},
		{"batch seq negative", `BATCH:[{"seq":-1,"content":"a"}]`},
		{"batch seq string", `BATCH:[{"seq":"1","content":"a"}]`},
		{"batch seq fraction", `BATCH:[{"seq":1.5,"content":"a"}]`},
		{"batch content number", `BATCH:[{"seq":1,"content":5}]`},
		{"batch gap", `BATCH:[{"seq":1,"content":"a"},{"seq":3,"content":"b"}]`},
		{"batch repeat", `BATCH:[{"seq":2,"content":"a"},{"seq":2,"content":"b"}]`},
		{"batch descending", `BATCH:[{"seq":2,"content":"a"},{"seq":1,"content":"b"}]`},
		{"retrying no payload", `SIGNAL:RETRYING`},
		{"retrying empty payload", `SIGNAL:RETRYING:`},
		{"retrying null", `SIGNAL:RETRYING:null`},
		{"retrying attempt 0", `SIGNAL:RETRYING:{"attempt":0,"retry_in_seconds":1,"reason":"timeout"}`},
		{"retrying negative delay", `SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":-1,"reason":"timeout"}`},
		{"retrying delay over an hour", `SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":3601,"reason":"timeout"}`},
		{"retrying no reason", `SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":1}`},
		{"retrying reason with a line break", `SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":1,"reason":"a\nb"}`},
		{"retrying reason of error text", `SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":1,"reason":"dial tcp: refused"}`},
		{"retrying trailing", `SIGNAL:RETRYING:{"attempt":1,"retry_in_seconds":1,"reason":"timeout"}}`},
		{"retrying attempt string", `SIGNAL:RETRYING:{"attempt":"1","retry_in_seconds":1,"reason":"timeout"}`},
		{"retrying fence zero", `SIGNAL:RETRYING:0:{"attempt":1,"retry_in_seconds":1,"reason":"timeout"}`},
		{"retrying fence leading zero", `SIGNAL:RETRYING:01:{"attempt":1,"retry_in_seconds":1,"reason":"timeout"}`},
		{"retrying fence without colon", `SIGNAL:RETRYING:1{"attempt":1,"retry_in_seconds":1,"reason":"timeout"}`},
		{"retrying fence only", `SIGNAL:RETRYING:3:`},
		{"done empty payload", `SIGNAL:DONE:`},
		{"done bad json", `SIGNAL:DONE:{"usage":`},
		{"done trailing", `SIGNAL:DONE:{}}`},
		{"done trailing value", `SIGNAL:DONE:{} {}`},
		{"done wrong type", `SIGNAL:DONE:{"usage":"lots"}`},
		{"error no payload", `SIGNAL:ERROR`},
		{"error empty payload", `SIGNAL:ERROR:`},
		{"error bad json", `SIGNAL:ERROR:{"type":`},
		{"error no type", `SIGNAL:ERROR:{"title":"Queue Timeout","status":503}`},
		{"error no status", `SIGNAL:ERROR:{"type":"https://spillway.dev/errors/queue-timeout"}`},
		{"error status 200", `SIGNAL:ERROR:{"type":"https://spillway.dev/errors/x","status":200}`},
		{"error status 600", `SIGNAL:ERROR:{"type":"https://spillway.dev/errors/x","status":600}`},
		{"error trailing", `SIGNAL:ERROR:{"type":"https://spillway.dev/errors/x","status":503}]`},
		{"reset no payload", `SIGNAL:RESET`},
		{"reset attempt 0", `SIGNAL:RESET:{"attempt":0}`},
		{"reset attempt missing", `SIGNAL:RESET:{}`},
		{"reset attempt negative", `SIGNAL:RESET:{"attempt":-2}`},
		{"reset trailing", `SIGNAL:RESET:{"attempt":2}}`},
		{"oversized", huge},
		{"fenced batch attempt 0", `BATCH:0:[{"seq":1,"content":"a"}]`},
		{"fenced batch leading zero", `BATCH:01:[{"seq":1,"content":"a"}]`},
		{"fenced batch ten digits", `BATCH:1000000000:[{"seq":1,"content":"a"}]`},
		{"fenced batch no colon", `BATCH:2[{"seq":1,"content":"a"}]`},
		{"fenced batch no payload", `BATCH:2:`},
		{"fenced batch negative", `BATCH:-2:[{"seq":1,"content":"a"}]`},
		{"fenced batch double header", `BATCH:2:3:[{"seq":1,"content":"a"}]`},
		{"fenced done no count", `SIGNAL:DONE:2`},
		{"fenced done colon no count", `SIGNAL:DONE:2:`},
		{"fenced done count negative", `SIGNAL:DONE:2:-1`},
		{"fenced done count leading zero", `SIGNAL:DONE:2:01`},
		{"fenced done attempt 0", `SIGNAL:DONE:0:5`},
		{"fenced done trailing colon", `SIGNAL:DONE:2:5:`},
		{"fenced done garbage after count", `SIGNAL:DONE:2:5x`},
		{"fenced done bad json", `SIGNAL:DONE:2:5:{`},
		{"fenced error attempt 0", `SIGNAL:ERROR:0:{"type":"t","status":503}`},
		{"fenced error no payload", `SIGNAL:ERROR:3:`},
		{"fenced heartbeat 0", `SIGNAL:HEARTBEAT:0`},
		{"fenced heartbeat empty", `SIGNAL:HEARTBEAT:`},
		{"fenced heartbeat trailing", `SIGNAL:HEARTBEAT:2:`},
		{"fenced heartbeat leading zero", `SIGNAL:HEARTBEAT:02`},
		{"reset attempt too large", `SIGNAL:RESET:{"attempt":1000000000}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeResult([]byte(tt.in))
			if err == nil {
				t.Fatalf("DecodeResult(%.80q) = %+v, want error", tt.in, got)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("DecodeResult(%.80q) error %v does not wrap ErrMalformed", tt.in, err)
			}
			if !reflect.DeepEqual(got, Result{}) {
				t.Errorf("DecodeResult(%.80q) returned %+v alongside an error", tt.in, got)
			}
		})
	}
}

func TestDecodeResultAcceptsAtSizeLimit(t *testing.T) {
	t.Parallel()
	head, tail := `BATCH:[{"seq":1,"content":"`, `"}]`
	msg := head + strings.Repeat("a", MaxResultBytes-len(head)-len(tail)) + tail
	if len(msg) != MaxResultBytes {
		t.Fatalf("test message is %d bytes, want %d", len(msg), MaxResultBytes)
	}
	if _, err := DecodeResult([]byte(msg)); err != nil {
		t.Fatalf("DecodeResult of exactly MaxResultBytes: %v", err)
	}
	if _, err := DecodeResult([]byte(msg + " ")); err == nil {
		t.Fatal("DecodeResult of MaxResultBytes+1 succeeded")
	}
}

// TestEncodeResultRejects checks that the encoder refuses what the decoder
// would refuse, so a worker learns at publish time, not the client never.
func TestEncodeResultRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   Result
	}{
		{"zero kind", Result{}},
		{"unknown kind", Result{Kind: 99}},
		{"batch nil", Result{Kind: KindBatch}},
		{"batch seq 0", Result{Kind: KindBatch, Chunks: []Chunk{{Seq: 0, Content: "a"}}}},
		{"batch gap", Result{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: "a"}, {Seq: 3, Content: "b"}}}},
		{"error nil", Result{Kind: KindError}},
		{"error no type", Result{Kind: KindError, Problem: &Problem{Title: "x", Status: 503}}},
		{"error status 0", Result{Kind: KindError, Problem: &Problem{Type: "t"}}},
		{"reset nil", Result{Kind: KindReset}},
		{"reset attempt 0", Result{Kind: KindReset, Reset: &Reset{}}},
		{"reset attempt differs", Result{Kind: KindReset, Attempt: 3, Reset: &Reset{Attempt: 2}}},
		{"attempt negative", Result{Kind: KindHeartbeat, Attempt: -1}},
		{"attempt too large", Result{Kind: KindHeartbeat, Attempt: MaxAttempt + 1}},
		{"count without attempt", Result{Kind: KindDone, Count: 3}},
		{"count negative", Result{Kind: KindDone, Attempt: 1, Count: -1}},
		{"batch too large", Result{Kind: KindBatch, Chunks: []Chunk{{Seq: 1, Content: strings.Repeat("x", MaxResultBytes)}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if b, err := EncodeResult(tt.in); err == nil {
				t.Errorf("EncodeResult(%s) = %.80q, want error", tt.name, b)
			}
		})
	}
}

func TestResultKindString(t *testing.T) {
	t.Parallel()
	want := map[ResultKind]string{
		KindBatch: "batch", KindDone: "done", KindError: "error",
		KindHeartbeat: "heartbeat", KindReset: "reset", 0: "unknown", 42: "unknown",
	}
	for k, w := range want {
		if got := k.String(); got != w {
			t.Errorf("ResultKind(%d).String() = %q, want %q", k, got, w)
		}
	}
}
