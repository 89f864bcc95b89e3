package openaiwire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// A tool-call answer of two choices as an upstream streams it, with
// reasoning, logprobs, a refusal and usage details.
var toolAnswer = []string{
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","choices":[{"index":0,"delta":{"reasoning_content":"Let me look."},"finish_reason":null}]}`,
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"look","arguments":""}}]},"finish_reason":null}]}`,
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\":"}}]},"finish_reason":null}]}`,
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"cat\"}"}}]},"finish_reason":null}]}`,
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","choices":[{"index":1,"delta":{"content":"No."},"logprobs":{"content":[{"token":"No","logprob":-0.1}],"refusal":null},"finish_reason":null}]}`,
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"},{"index":1,"delta":{},"finish_reason":"stop"}]}`,
	`{"id":"chatcmpl-up","object":"chat.completion.chunk","created":7,"model":"gpt-x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13,"completion_tokens_details":{"reasoning_tokens":2}}}`,
}

func TestAppendChunkEventMakesOnlyTheIDOurs(t *testing.T) {
	t.Parallel()
	id := []byte(`"chatcmpl-req1"`)
	for _, raw := range []string{toolAnswer[2], `{"object":"x","id":"a\"b","n":1}`, `{"n":1}`} {
		got := string(AppendChunkEvent(nil, []byte(raw), id))
		if !strings.HasPrefix(got, "data: ") || !strings.HasSuffix(got, "\n\n") {
			t.Fatalf("not one SSE event: %q", got)
		}
		var in, out map[string]any
		_ = json.Unmarshal([]byte(raw), &in)
		if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(got, "data: "), "\n\n")), &out); err != nil {
			t.Fatalf("%q: %v", got, err)
		}
		in["id"] = "chatcmpl-req1"
		if !reflect.DeepEqual(in, out) {
			t.Errorf("relayed %v, want %v", out, in)
		}
	}
}

func TestNativeEventsShowEveryDelta(t *testing.T) {
	t.Parallel()
	var all []string
	for _, raw := range toolAnswer {
		buf, spans := AppendNativeEvents(nil, []byte(raw), true)
		for _, s := range spans {
			all = append(all, string(buf[s[0]:s[1]]))
		}
	}
	want := []string{
		`{"content":"","reasoning":"Let me look.","choice":0}`,
		`{"content":"","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"look","arguments":""}}],"choice":0}`,
		`{"content":"","tool_calls":[{"index":0,"function":{"arguments":"{\"q\":"}}],"choice":0}`,
		`{"content":"","tool_calls":[{"index":0,"function":{"arguments":"\"cat\"}"}}],"choice":0}`,
		`{"content":"No.","logprobs":{"content":[{"token":"No","logprob":-0.1}],"refusal":null},"choice":1}`,
	}
	if !reflect.DeepEqual(all, want) {
		t.Errorf("events\n got %q\nwant %q", all, want)
	}
}

func TestAssemblerJoinsTheAnswer(t *testing.T) {
	t.Parallel()
	a := NewAssembler("req1", "asked", 1)
	for _, raw := range toolAnswer {
		a.Chunk([]byte(raw))
	}
	var got map[string]any
	if err := json.Unmarshal(a.Object(), &got); err != nil {
		t.Fatalf("%s: %v", a.Object(), err)
	}
	var want map[string]any
	_ = json.Unmarshal([]byte(`{"id":"chatcmpl-req1","object":"chat.completion","created":7,"model":"gpt-x",
		"choices":[
		 {"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"Let me look.","refusal":null,
		  "tool_calls":[{"id":"call_1","type":"function","function":{"name":"look","arguments":"{\"q\":\"cat\"}"}}]},
		  "logprobs":null,"finish_reason":"tool_calls"},
		 {"index":1,"message":{"role":"assistant","content":"No.","refusal":null},
		  "logprobs":{"content":[{"token":"No","logprob":-0.1}],"refusal":null},"finish_reason":"stop"}],
		"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13,"completion_tokens_details":{"reasoning_tokens":2}},
		"system_fingerprint":"fp_1"}`), &want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("assembled\n %s", a.Object())
	}
	if !IsUsageChunk([]byte(toolAnswer[7])) || IsUsageChunk([]byte(toolAnswer[6])) {
		t.Error("IsUsageChunk misread the usage chunk")
	}
	if !IsPreamble([]byte(toolAnswer[0])) || IsPreamble([]byte(toolAnswer[1])) {
		t.Error("IsPreamble misread the preamble")
	}
}
