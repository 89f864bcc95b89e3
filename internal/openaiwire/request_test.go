package openaiwire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// A tool conversation's next turn, as the SDKs send it: an assistant
// message with tool_calls and null content, then the tool's answer; an
// image part; parameters Spillway does not read.
const toolTurn = `{"model":"gpt-4o","messages":[` +
	`{"role":"developer","content":"Be brief.","name":"ops"},` +
	`{"role":"user","content":[{"type":"text","text":"What is in this picture?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]},` +
	`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"look","arguments":"{}"}}]},` +
	`{"role":"tool","tool_call_id":"call_1","content":"a cat"}],` +
	`"tools":[{"type":"function","function":{"name":"look","parameters":{"type":"object","properties":{}}}}],` +
	`"tool_choice":"auto","parallel_tool_calls":false,"response_format":{"type":"json_object"},` +
	`"max_completion_tokens":65536,"n":2,"seed":7,"stop":["\n\n"],"logprobs":true,"top_logprobs":2,` +
	`"reasoning_effort":"low","metadata":{"k":"v"},"store":true,"service_tier":"auto","user":"u1",` +
	`"stream":true,"stream_options":{"include_usage":true},"x_unknown":{"kept":[1,2]}}`

func TestDecodeRequestKeepsTheBody(t *testing.T) {
	t.Parallel()
	req, err := DecodeRequest([]byte(toolTurn), protocol.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	c := req.Chat
	if string(c.Body) != toolTurn {
		t.Errorf("body changed:\n got %s\nwant %s", c.Body, toolTurn)
	}
	want := protocol.ChatRequest{
		Messages: []protocol.Message{
			{Role: "developer", Content: "Be brief."}, {Role: "user", Content: "What is in this picture?"},
			{Role: "assistant", Content: ""}, {Role: "tool", Content: "a cat"},
		},
		Model: "gpt-4o", MaxTokens: 65536, Body: c.Body, Route: protocol.RouteChat, TokensField: "max_completion_tokens",
		N: 2, Stream: true, IncludeUsage: true, Tools: []string{"look"}, ReasoningEffort: "low",
		TextBytes: len("Be brief.") + len("What is in this picture?") + len("a cat"), NonTextParts: 1,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("read\n %+v\nwant\n %+v", c, want)
	}
	if !req.Stream || !req.IncludeUsage {
		t.Errorf("Stream %v IncludeUsage %v, want both", req.Stream, req.IncludeUsage)
	}
}

func TestUpstreamBodyChangesOnlyWhatSpillwayOwns(t *testing.T) {
	t.Parallel()
	body := `{"messages":[{"role":"user","content":"hi"}],"stream":false,"stream_options":{"other":1},"max_tokens":9000,"seed":3}`
	req, err := DecodeRequest([]byte(body), protocol.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	req.Chat.CapTokens(1024)
	up, ok := req.Chat.UpstreamBody("default-model")
	if !ok {
		t.Fatal("no upstream body")
	}
	want := `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"other":1,"include_usage":true},"max_tokens":1024,"seed":3,"model":"default-model"}`
	if string(up) != want {
		t.Errorf("upstream body\n got %s\nwant %s", up, want)
	}
	// The cap goes in the field the client used, and none is added under
	// another name.
	req, _ = DecodeRequest([]byte(`{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5000,"model":"m"}`), protocol.DefaultLimits)
	req.Chat.CapTokens(1024)
	up, _ = req.Chat.UpstreamBody("default-model")
	if want := `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1024,"model":"m","stream":true,"stream_options":{"include_usage":true}}`; string(up) != want {
		t.Errorf("upstream body\n got %s\nwant %s", up, want)
	}
}

func TestDecodeRequestRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, body, want string }{
		{"not JSON", `{"messages":`, "malformed JSON"},
		{"array", `[1]`, "JSON object"},
		{"no messages", `{"model":"m"}`, "messages is required"},
		{"empty messages", `{"messages":[]}`, "must not be empty"},
		{"message not an object", `{"messages":[1]}`, "must be an object"},
		{"no role", `{"messages":[{"content":"x"}]}`, "role must be one of"},
		{"number content", `{"messages":[{"role":"user","content":3}]}`, "content must be a string, null or an array"},
		{"part not an object", `{"messages":[{"role":"user","content":["x"]}]}`, "content[0] must be an object"},
		{"n", `{"messages":[{"role":"user","content":"x"}],"n":9}`, "n must be an integer between 1 and 8"},
		{"max_tokens", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`, "max_tokens must be an integer"},
		{"temperature", `{"messages":[{"role":"user","content":"x"}],"temperature":3}`, "temperature must be"},
		{"stream", `{"messages":[{"role":"user","content":"x"}],"stream":"yes"}`, "stream must be"},
		{"stream_options", `{"messages":[{"role":"user","content":"x"}],"stream_options":[]}`, "stream_options must be"},
		{"tools", `{"messages":[{"role":"user","content":"x"}],"tools":{}}`, "tools must be"},
		{"escaped NUL", `{"messages":[{"role":"user","content":"a\u0000"}]}`, "NUL"},
		{"prompt is not ours here", `{"prompt":"x"}`, "messages is required"},
	}
	for _, tt := range tests {
		_, err := DecodeRequest([]byte(tt.body), protocol.DefaultLimits)
		if !errors.Is(err, protocol.ErrInvalidRequest) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one saying %q", tt.name, err, tt.want)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(toolTurn))
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":""}],"model":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := DecodeRequest(b, protocol.DefaultLimits)
		if err != nil {
			if !errors.Is(err, protocol.ErrInvalidRequest) {
				t.Fatalf("error %v does not wrap ErrInvalidRequest", err)
			}
			return
		}
		if string(req.Chat.Body) != string(b) {
			t.Fatalf("accepted body changed: %q", req.Chat.Body)
		}
		up, ok := req.Chat.UpstreamBody("m")
		if !ok {
			t.Fatalf("no upstream body for %q", b)
		}
		var sent, got map[string]any
		if err := json.Unmarshal(b, &sent); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", b, err)
		}
		if err := json.Unmarshal(up, &got); err != nil {
			t.Fatalf("upstream body %q of %q: %v", up, b, err)
		}
		if got["stream"] != true {
			t.Fatalf("upstream body %q: stream not true", up)
		}
		// Every member Spillway does not own is sent as it came.
		for k, v := range sent {
			switch k {
			case "stream", "stream_options", "model":
				continue
			}
			if !reflect.DeepEqual(got[k], v) {
				t.Fatalf("member %q changed: %v, sent %v", k, got[k], v)
			}
		}
	})
}
