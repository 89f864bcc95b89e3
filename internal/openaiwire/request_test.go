package openaiwire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/protocol"
)

var testLimits = protocol.Limits{MaxMessages: 3, MaxTokens: 100}

func TestDecodeRequestAccepts(t *testing.T) {
	t.Parallel()
	temp := 0.5
	tests := []struct {
		name string
		body string
		want Request
	}{
		{"string content", `{"model":"sim","messages":[{"role":"user","content":"Hi"}]}`,
			Request{Chat: protocol.ChatRequest{Model: "sim", Messages: []protocol.Message{{Role: "user", Content: "Hi"}}}}},
		{"text parts joined by a line break, developer is system",
			`{"messages":[{"role":"developer","content":"Be brief"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			Request{Chat: protocol.ChatRequest{Messages: []protocol.Message{{Role: "system", Content: "Be brief"}, {Role: "user", Content: "a\nb"}}}}},
		{"stream with usage, limits, unknown and ignored fields",
			`{"model":"m","messages":[{"role":"user","content":"x","name":"bob"}],"stream":true,"stream_options":{"include_usage":true},
			  "max_tokens":7,"temperature":0.5,"n":1,"tools":[],"seed":3,"user":"u","frequency_penalty":0,"logprobs":null,"whatever":{"a":[1]}}`,
			Request{Stream: true, IncludeUsage: true,
				Chat: protocol.ChatRequest{Model: "m", MaxTokens: 7, Temperature: &temp, Messages: []protocol.Message{{Role: "user", Content: "x"}}}}},
		{"max_completion_tokens wins over max_tokens", `{"messages":[{"role":"user","content":"x"}],"max_tokens":7,"max_completion_tokens":9}`,
			Request{Chat: protocol.ChatRequest{MaxTokens: 9, Messages: []protocol.Message{{Role: "user", Content: "x"}}}}},
		{"nulls are absent", `{"messages":[{"role":"user","content":"x"}],"max_tokens":null,"max_completion_tokens":null,"stream":null,"stream_options":null,"n":null,"temperature":null}`,
			Request{Chat: protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "x"}}}}},
		{"stream false", `{"messages":[{"role":"assistant","content":"x"}],"stream":false}`,
			Request{Chat: protocol.ChatRequest{Messages: []protocol.Message{{Role: "assistant", Content: "x"}}}}},
	}
	for _, tt := range tests {
		got, err := DecodeRequest([]byte(tt.body), testLimits)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.name, got, tt.want)
		}
	}
}

func TestDecodeRequestRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, says string
	}{
		{"not an object", `[1]`, "JSON object"},
		{"empty", ``, "JSON object"},
		{"malformed", `{"messages":`, "malformed JSON"},
		{"wrong type", `{"messages":"hi"}`, "malformed JSON"},
		{"invalid UTF-8", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "UTF-8"},
		{"no messages", `{"model":"m"}`, "messages is required"},
		{"empty messages", `{"messages":[]}`, "must not be empty"},
		{"too many messages", `{"messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, 5) + `{"role":"user","content":"x"}]}`, "at most 3 messages"},
		{"null content", `{"messages":[{"role":"assistant","content":null}]}`, "needs role and content"},
		{"no role", `{"messages":[{"content":"x"}]}`, "needs role and content"},
		{"bad role", `{"messages":[{"role":"robot","content":"x"}]}`, "role must be"},
		{"empty content", `{"messages":[{"role":"user","content":""}]}`, "non-empty"},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "only text"},
		{"number content", `{"messages":[{"role":"user","content":5}]}`, "string or an array of text parts"},
		{"NUL", `{"messages":[{"role":"user","content":"a\u0000b"}]}`, "NUL"},
		{"max_tokens over the limit", `{"messages":[{"role":"user","content":"x"}],"max_tokens":101}`, "between 1 and 100"},
		{"max_completion_tokens zero", `{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0}`, "between 1 and 100"},
		{"max_tokens not an integer", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`, "integer"},
		{"temperature", `{"messages":[{"role":"user","content":"x"}],"temperature":3}`, "temperature"},
		{"n", `{"messages":[{"role":"user","content":"x"}],"n":2}`, "n must be 1"},
		{"long model", `{"model":"` + strings.Repeat("m", 257) + `","messages":[{"role":"user","content":"x"}]}`, "model is longer"},
	}
	for _, tt := range tests {
		_, err := DecodeRequest([]byte(tt.body), testLimits)
		if !errors.Is(err, protocol.ErrInvalidRequest) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s: error %v, want one saying %q", tt.name, err, tt.says)
		}
	}
}

// A body both endpoints read gives the same request as /v1/stream's
// decoder: one set of rules.
func TestDecodeRequestAgreesWithStream(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"messages":[{"role":"system","content":"s"},{"role":"user","content":"naïve ☕"}],"model":"m","max_tokens":5,"temperature":1}`,
		`{"messages":[{"role":"tool","content":"{\"a\":1}"}]}`,
	} {
		want, err := protocol.DecodeChatRequest([]byte(body), testLimits)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRequest([]byte(body), testLimits)
		if err != nil || !reflect.DeepEqual(got.Chat, want) {
			t.Fatalf("%s: got %+v, %v; want %+v", body, got.Chat, err, want)
		}
	}
}

// FuzzDecodeRequest: any body either decodes to a request within the
// limits, or is refused with ErrInvalidRequest; never a panic.
func FuzzDecodeRequest(f *testing.F) {
	for _, seed := range []string{
		// What openai-go v3 sends for a streamed request with usage.
		`{"messages":[{"content":"Tell me about spillways","role":"user"}],"model":"sim","stream_options":{"include_usage":true},"stream":true}`,
		`{"messages":[{"content":[{"text":"a","type":"text"},{"text":"b","type":"text"}],"role":"user"}],"model":"gpt-4o","max_completion_tokens":16,"temperature":0.2}`,
		`{"messages":[{"role":"developer","content":"x"},{"role":"assistant","content":null,"tool_calls":[]}],"n":2}`,
		`{"messages":[{"role":"user","content":"\u0000"}],"max_tokens":"7"}`,
		`{"messages":[],"stream":1}`,
		"{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeRequest(body, testLimits)
		if err != nil {
			if !errors.Is(err, protocol.ErrInvalidRequest) {
				t.Fatalf("error %v does not wrap ErrInvalidRequest", err)
			}
			return
		}
		msgs := req.Chat.Messages
		if len(msgs) == 0 || len(msgs) > testLimits.MaxMessages || req.Chat.MaxTokens < 0 || req.Chat.MaxTokens > testLimits.MaxTokens {
			t.Fatalf("accepted out of limits: %+v", req)
		}
		for _, m := range msgs {
			if m.Content == "" || strings.ContainsRune(m.Content, 0) {
				t.Fatalf("accepted message %+v", m)
			}
		}
		if req.IncludeUsage && !json.Valid(body) {
			t.Fatal("accepted invalid JSON")
		}
	})
}
