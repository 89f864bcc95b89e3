package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// secret stands for whatever a client sends; no error text may carry it.
const secret = "sk-live-S3CR3T-7f3a"

func TestDecodeChatRequestAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		lim  Limits
		body string
		want ChatRequest
	}{
		{
			name: "messages",
			body: `{"messages":[{"role":"user","content":"Hello"}],"model":"sim-1","max_tokens":256,"temperature":0.7,"thread_id":"optional"}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "Hello"}}, Model: "sim-1", MaxTokens: 256, Temperature: ptr(0.7), ThreadID: "optional"},
		},
		{
			name: "every role",
			body: `{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"tool","content":"t"}]}`,
			want: ChatRequest{Messages: []Message{{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"tool", "t"}}},
		},
		{
			name: "prompt shorthand",
			body: `{"prompt":"Hello"}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "Hello"}}},
		},
		{
			name: "white space around the object",
			body: " \t\r\n{\"prompt\":\"Hello\"} \t\r\n",
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "Hello"}}},
		},
		{
			name: "unicode and escapes",
			body: `{"prompt":"Grüße 🌊 \"q\"\nline\r\n\t\u00e9"}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "Grüße 🌊 \"q\"\nline\r\n\té"}}},
		},
		{
			// An escaped backslash then u0000 is the six characters \u0000,
			// as in a question about JSON, not a NUL.
			name: "literal backslash u0000 is not a NUL",
			body: `{"prompt":"how do I write \\u0000 in JSON?"}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: `how do I write \u0000 in JSON?`}}},
		},
		{
			name: "literal backslash u0000 after escaped backslashes",
			body: `{"prompt":"a\\\\\\u0000b"}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: `a\\\u0000b`}}},
		},
		{
			name: "unknown fields are ignored",
			body: `{"prompt":"x","stream":true,"user":"bob","extra":{"a":[1,2]}}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}},
		},
		{
			name: "null optional fields are unset",
			body: `{"prompt":"x","max_tokens":null,"temperature":null,"model":null,"thread_id":null,"messages":null}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}},
		},
		{
			name: "max_tokens 1",
			body: `{"prompt":"x","max_tokens":1}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, MaxTokens: 1},
		},
		{
			name: "max_tokens exactly the default limit",
			body: `{"prompt":"x","max_tokens":32768}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, MaxTokens: 32768},
		},
		{
			name: "max_tokens exactly a custom limit",
			lim:  Limits{MaxMessages: 10, MaxTokens: 100},
			body: `{"prompt":"x","max_tokens":100}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, MaxTokens: 100},
		},
		{
			name: "temperature 0",
			body: `{"prompt":"x","temperature":0}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, Temperature: ptr(0.0)},
		},
		{
			name: "temperature 2",
			body: `{"prompt":"x","temperature":2}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, Temperature: ptr(2.0)},
		},
		{
			name: "temperature 2.0 exponent form",
			body: `{"prompt":"x","temperature":0.2e1}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, Temperature: ptr(2.0)},
		},
		{
			name: "exactly MaxMessages",
			lim:  Limits{MaxMessages: 3, MaxTokens: 10},
			body: `{"messages":[{"role":"user","content":"1"},{"role":"assistant","content":"2"},{"role":"user","content":"3"}]}`,
			want: ChatRequest{Messages: []Message{{"user", "1"}, {"assistant", "2"}, {"user", "3"}}},
		},
		{
			name: "thread_id 128 characters",
			body: `{"prompt":"x","thread_id":"` + strings.Repeat("t", 128) + `"}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, ThreadID: strings.Repeat("t", 128)},
		},
		{
			name: "model 256 characters",
			body: `{"prompt":"x","model":"` + strings.Repeat("m", 256) + `"}`,
			want: ChatRequest{Messages: []Message{{Role: "user", Content: "x"}}, Model: strings.Repeat("m", 256)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lim := tt.lim
			if lim == (Limits{}) {
				lim = DefaultLimits
			}
			got, err := DecodeChatRequest([]byte(tt.body), lim)
			if err != nil {
				t.Fatalf("DecodeChatRequest(%s): %v", tt.body, err)
			}
			if !reflect.DeepEqual(textView(got), tt.want) {
				t.Errorf("DecodeChatRequest(%s) =\n%+v\nwant\n%+v", tt.body, got, tt.want)
			}
		})
	}
}

// TestPromptEqualsOneUserMessage checks the shorthand against the long form
// it stands for, field by field, for contents that stress escaping.
func TestPromptEqualsOneUserMessage(t *testing.T) {
	t.Parallel()
	for _, content := range []string{`Hello`, `a\nb`, `\"quoted\"`, `日本語`, `\u2028`, `  spaced  `} {
		t.Run(content, func(t *testing.T) {
			t.Parallel()
			short, err := DecodeChatRequest([]byte(`{"prompt":"`+content+`","max_tokens":5}`), DefaultLimits)
			if err != nil {
				t.Fatalf("prompt form: %v", err)
			}
			long, err := DecodeChatRequest([]byte(`{"messages":[{"role":"user","content":"`+content+`"}],"max_tokens":5}`), DefaultLimits)
			if err != nil {
				t.Fatalf("messages form: %v", err)
			}
			if !reflect.DeepEqual(textView(short), textView(long)) || !jsonEqual(t, short.Body, long.Body) {
				t.Errorf("prompt form %+v differs from messages form %+v", short, long)
			}
			if len(short.Messages) != 1 || short.Messages[0].Role != "user" {
				t.Errorf("prompt gave messages %+v, want exactly one user message", short.Messages)
			}
		})
	}
}

func TestDecodeChatRequestRejects(t *testing.T) {
	t.Parallel()
	msg := func(role, content string) string {
		return fmt.Sprintf(`{"role":%q,"content":%q}`, role, content)
	}
	many := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = msg("user", secret)
		}
		return `{"messages":[` + strings.Join(parts, ",") + `]}`
	}
	ok := `{"messages":[` + msg("user", secret) + `]`
	tests := []struct {
		name string
		lim  Limits
		body string
	}{
		{"empty body", Limits{}, ``},
		{"white space only", Limits{}, " \n\t"},
		{"malformed JSON", Limits{}, `{"prompt":"` + secret + `"`},
		{"malformed JSON missing colon", Limits{}, `{"prompt" "` + secret + `"}`},
		{"single quotes", Limits{}, `{'prompt':'` + secret + `'}`},
		{"top-level array", Limits{}, `[{"prompt":"` + secret + `"}]`},
		{"top-level string", Limits{}, `"` + secret + `"`},
		{"top-level number", Limits{}, `42`},
		{"top-level null", Limits{}, `null`},
		{"top-level true", Limits{}, `true`},
		{"both prompt and messages", Limits{}, `{"prompt":"` + secret + `","messages":[` + msg("user", secret) + `]}`},
		{"both, messages empty", Limits{}, `{"prompt":"` + secret + `","messages":[]}`},
		{"neither", Limits{}, `{"model":"` + secret + `"}`},
		{"empty object", Limits{}, `{}`},
		{"messages a string", Limits{}, `{"messages":"` + secret + `"}`},
		{"messages an object", Limits{}, `{"messages":` + msg("user", secret) + `}`},
		{"message a string", Limits{}, `{"messages":["` + secret + `"]}`},
		{"message null", Limits{}, `{"messages":[null]}`},
		{"content a number", Limits{}, `{"messages":[{"role":"user","content":42}]}`},
		{"content an array", Limits{}, `{"messages":[{"role":"user","content":["` + secret + `"]}]}`},
		{"role a number", Limits{}, `{"messages":[{"role":1,"content":"` + secret + `"}]}`},
		{"prompt a number", Limits{}, `{"prompt":7}`},
		{"prompt empty", Limits{}, `{"prompt":""}`},
		{"empty messages", Limits{}, `{"messages":[]}`},
		{"missing role", Limits{}, `{"messages":[{"content":"` + secret + `"}]}`},
		{"unknown role", Limits{}, `{"messages":[` + msg(secret, "hi") + `]}`},
		{"role wrong case", Limits{}, `{"messages":[` + msg("User", secret) + `]}`},
		{"too many messages (custom limit)", Limits{MaxMessages: 2, MaxTokens: 10}, many(3)},
		{"too many messages (default limit)", Limits{}, many(1001)},
		{"max_tokens 0", Limits{}, ok + `,"max_tokens":0}`},
		{"max_tokens negative", Limits{}, ok + `,"max_tokens":-1}`},
		{"max_tokens over limit", Limits{}, ok + `,"max_tokens":1048577}`},
		{"max_completion_tokens zero", Limits{}, ok + `,"max_completion_tokens":0}`},
		{"n over MAX_CHOICES", Limits{}, ok + `,"n":9}`},
		{"n zero", Limits{}, ok + `,"n":0}`},
		{"role unknown", Limits{}, `{"messages":[` + msg("robot", secret) + `]}`},
		{"content a number", Limits{}, `{"messages":[{"role":"user","content":7}]}`},
		{"content part not an object", Limits{}, `{"messages":[{"role":"user","content":["` + secret + `"]}]}`},
		{"nested 65 deep", Limits{}, ok + `,"x":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`},
		{"message not an object", Limits{}, `{"messages":["` + secret + `"]}`},
		{"max_tokens over custom limit", Limits{MaxMessages: 10, MaxTokens: 100}, ok + `,"max_tokens":101}`},
		{"max_tokens huge", Limits{}, ok + `,"max_tokens":99999999999999999999999}`},
		{"max_tokens string", Limits{}, ok + `,"max_tokens":"256"}`},
		{"max_tokens fraction", Limits{}, ok + `,"max_tokens":1.5}`},
		{"max_tokens bool", Limits{}, ok + `,"max_tokens":true}`},
		{"temperature negative", Limits{}, ok + `,"temperature":-0.1}`},
		{"temperature over 2", Limits{}, ok + `,"temperature":2.1}`},
		{"temperature just over 2", Limits{}, ok + `,"temperature":2.0000001}`},
		{"temperature string", Limits{}, ok + `,"temperature":"0.7"}`},
		{"temperature overflow", Limits{}, ok + `,"temperature":1e999}`},
		{"model a number", Limits{}, ok + `,"model":5}`},
		{"model too long", Limits{}, ok + `,"model":"` + strings.Repeat("m", 257) + `"}`},
		{"thread_id too long", Limits{}, ok + `,"thread_id":"` + strings.Repeat("t", 129) + `"}`},
		{"thread_id a number", Limits{}, ok + `,"thread_id":5}`},
		{"NUL raw in content", Limits{}, `{"prompt":"` + secret + "\x00" + `"}`},
		{"NUL raw outside strings", Limits{}, `{"prompt":"` + secret + `"}` + "\x00"},
		{"NUL escaped in content", Limits{}, `{"prompt":"` + secret + `\u0000"}`},
		{"NUL escaped in messages", Limits{}, `{"messages":[` + `{"role":"user","content":"a\u0000` + secret + `"}]}`},
		{"NUL escaped after an escaped quote", Limits{}, `{"prompt":"` + secret + `\"\u0000"}`},
		{"NUL escaped after an escaped backslash", Limits{}, `{"prompt":"` + secret + `\\\u0000"}`},
		{"NUL escaped in model", Limits{}, ok + `,"model":"m\u0000"}`},
		{"NUL escaped in an unknown key", Limits{}, ok + `,"x\u0000":1}`},
		{"invalid UTF-8", Limits{}, `{"prompt":"` + secret + "\xff\xfe" + `"}`},
		{"truncated UTF-8", Limits{}, `{"prompt":"` + secret + "\xe6\x97" + `"}`},
		{"trailing object", Limits{}, ok + `} {}`},
		{"trailing number", Limits{}, ok + `} 1`},
		{"trailing brace", Limits{}, ok + `}}`},
		{"trailing bracket", Limits{}, ok + `}]`},
		{"trailing comma", Limits{}, ok + `},`},
		{"trailing garbage", Limits{}, ok + `}xyz` + secret},
		{"trailing second request", Limits{}, ok + `}{"prompt":"` + secret + `"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lim := tt.lim
			if lim == (Limits{}) {
				lim = DefaultLimits
			}
			got, err := DecodeChatRequest([]byte(tt.body), lim)
			if err == nil {
				t.Fatalf("DecodeChatRequest(%.120q) = %+v, want error", tt.body, got)
			}
			if !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("error %q does not wrap ErrInvalidRequest", err)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "S3CR3T") {
				t.Errorf("error %q echoes the input", err)
			}
			if !reflect.DeepEqual(got, ChatRequest{}) {
				t.Errorf("DecodeChatRequest returned %+v alongside an error", got)
			}
		})
	}
}

// textView is req less what the decoders keep besides the fields the
// tests compare: the body and what is read of it for the provider.
func textView(req ChatRequest) ChatRequest {
	return ChatRequest{Messages: req.Messages, Model: req.Model, MaxTokens: req.MaxTokens, Temperature: req.Temperature, ThreadID: req.ThreadID}
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func TestDecodeResponses(t *testing.T) {
	t.Parallel()
	body := `{"model":"gpt-up","input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]},{"type":"function_call_output","call_id":"c1","output":"21"}],"previous_response_id":"resp_1","store":true,"max_output_tokens":9000,"tools":[{"type":"function","name":"get_weather"}],"stream":true}`
	req, err := DecodeResponses([]byte(body), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if string(req.Body) != body || req.Route != RouteResponses || !req.Stream || req.MaxTokens != 9000 ||
		req.TokensField != "max_output_tokens" || len(req.Tools) != 1 || req.Tools[0] != "get_weather" || req.NonTextParts != 1 {
		t.Fatalf("read %+v", req)
	}
	req.CapTokens(1024)
	up, ok := req.UpstreamBody("m")
	var got map[string]any
	if !ok || json.Unmarshal(up, &got) != nil || got["max_output_tokens"] != float64(1024) || got["stream"] != true ||
		got["previous_response_id"] != "resp_1" || got["stream_options"] != nil {
		t.Fatalf("upstream body %s", up)
	}
	for _, bad := range []string{`{}`, `{"input":3}`, `{"input":[]}`, `{"input":[1]}`, `{"input":"x","max_output_tokens":0}`, `[1]`} {
		if _, err := DecodeResponses([]byte(bad), DefaultLimits); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%s: error %v, want a 400", bad, err)
		}
	}
}
