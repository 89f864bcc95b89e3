package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// The transparent proxy (docs/API.md, "OpenAI-compatible API"): each
// request is sent once straight to a recording upstream and once through
// Spillway, on the direct and the queued path, and both what the upstream
// received and what the client got back are compared.

// recorder is an OpenAI-compatible upstream that records every body it
// receives and answers from a script chosen by the last message's text.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
}

// Scripts, by the last user message's text.
const (
	scriptTools     = "call the tool"
	scriptReasoning = "think first"
	scriptRefusal   = "refuse"
	scriptChoices   = "two answers"
	scriptReject    = "bad request"
)

// upstreamChunks is each script's streamed answer, as an upstream sends
// it (ids, fingerprints, logprobs and usage details included).
var upstreamChunks = map[string][]string{
	scriptTools: {
		`{"id":"chatcmpl-up1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up","system_fingerprint":"fp_up","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-up1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up","system_fingerprint":"fp_up","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-up1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up","system_fingerprint":"fp_up","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-up1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up","system_fingerprint":"fp_up","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]}`,
		`{"id":"chatcmpl-up1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up","system_fingerprint":"fp_up","choices":[],"usage":{"prompt_tokens":31,"completion_tokens":9,"total_tokens":40,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`,
	},
	scriptReasoning: {
		`{"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000001,"model":"reasoner","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000001,"model":"reasoner","choices":[{"index":0,"delta":{"reasoning_content":"Two and two"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000001,"model":"reasoner","choices":[{"index":0,"delta":{"reasoning_content":" make four."},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000001,"model":"reasoner","choices":[{"index":0,"delta":{"content":"4"},"logprobs":{"content":[{"token":"4","logprob":-0.01,"bytes":[52],"top_logprobs":[]}],"refusal":null},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000001,"model":"reasoner","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000001,"model":"reasoner","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":12,"total_tokens":17,"completion_tokens_details":{"reasoning_tokens":11}}}`,
	},
	scriptRefusal: {
		`{"id":"chatcmpl-up3","object":"chat.completion.chunk","created":1700000002,"model":"gpt-up","choices":[{"index":0,"delta":{"role":"assistant","refusal":""},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up3","object":"chat.completion.chunk","created":1700000002,"model":"gpt-up","choices":[{"index":0,"delta":{"refusal":"I can't help with that."},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up3","object":"chat.completion.chunk","created":1700000002,"model":"gpt-up","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"id":"chatcmpl-up3","object":"chat.completion.chunk","created":1700000002,"model":"gpt-up","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`,
	},
	scriptChoices: {
		`{"id":"chatcmpl-up4","object":"chat.completion.chunk","created":1700000003,"model":"gpt-up","choices":[{"index":0,"delta":{"role":"assistant","content":"Yes"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up4","object":"chat.completion.chunk","created":1700000003,"model":"gpt-up","choices":[{"index":1,"delta":{"role":"assistant","content":"No"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-up4","object":"chat.completion.chunk","created":1700000003,"model":"gpt-up","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"id":"chatcmpl-up4","object":"chat.completion.chunk","created":1700000003,"model":"gpt-up","choices":[{"index":1,"delta":{},"finish_reason":"length"}]}`,
		`{"id":"chatcmpl-up4","object":"chat.completion.chunk","created":1700000003,"model":"gpt-up","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`,
	},
}

// upstreamCompletions is each script's answer without stream, as the
// upstream writes it: what Spillway's assembled object must equal.
var upstreamCompletions = map[string]string{
	scriptTools:     `{"id":"chatcmpl-up1","object":"chat.completion","created":1700000000,"model":"gpt-up","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":31,"completion_tokens":9,"total_tokens":40,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},"system_fingerprint":"fp_up"}`,
	scriptReasoning: `{"id":"chatcmpl-up2","object":"chat.completion","created":1700000001,"model":"reasoner","choices":[{"index":0,"message":{"role":"assistant","content":"4","reasoning_content":"Two and two make four.","refusal":null},"logprobs":{"content":[{"token":"4","logprob":-0.01,"bytes":[52],"top_logprobs":[]}],"refusal":null},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":12,"total_tokens":17,"completion_tokens_details":{"reasoning_tokens":11}}}`,
	scriptRefusal:   `{"id":"chatcmpl-up3","object":"chat.completion","created":1700000002,"model":"gpt-up","choices":[{"index":0,"message":{"role":"assistant","content":"","refusal":"I can't help with that."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`,
	scriptChoices:   `{"id":"chatcmpl-up4","object":"chat.completion","created":1700000003,"model":"gpt-up","choices":[{"index":0,"message":{"role":"assistant","content":"Yes","refusal":null},"logprobs":null,"finish_reason":"stop"},{"index":1,"message":{"role":"assistant","content":"No","refusal":null},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`,
}

// rejectBody is the upstream's refusal of a bad request.
const rejectBody = `{"error":{"message":"Invalid value for 'tool_choice': no function named 'nope'.","type":"invalid_request_error","param":"tool_choice","code":"invalid_value"}}`

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.bodies = append(rc.bodies, body)
	rc.mu.Unlock()
	var req struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad body"}}`, http.StatusBadRequest)
		return
	}
	var text string
	_ = json.Unmarshal(req.Messages[len(req.Messages)-1].Content, &text)
	if text == scriptReject {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, rejectBody)
		return
	}
	chunks, ok := upstreamChunks[text]
	if !ok {
		http.Error(w, `{"error":{"message":"no script"}}`, http.StatusNotFound)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, upstreamCompletions[text])
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i, c := range chunks {
		if i == len(chunks)-1 && !req.StreamOptions.IncludeUsage {
			break // the usage chunk only when asked, as OpenAI does
		}
		_, _ = io.WriteString(w, "data: "+c+"\n\n")
		w.(http.Flusher).Flush()
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

func (rc *recorder) last(tb testing.TB) []byte {
	tb.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.bodies) == 0 {
		tb.Fatal("the upstream received nothing")
	}
	return rc.bodies[len(rc.bodies)-1]
}

// chatBody is a chat request of a tool conversation's shape, with every
// parameter a client may send, ending in the user text that picks the
// script.
func chatBody(text string, stream, usage bool) string {
	b := `{"model":"gpt-up","messages":[` +
		`{"role":"developer","content":"Answer with tools when you can.","name":"ops"},` +
		`{"role":"user","content":[{"type":"text","text":"Look at this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==","detail":"low"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},` +
		`{"role":"tool","tool_call_id":"call_0","content":"{\"temp\":21}"},` +
		`{"role":"user","content":"` + text + `"}],` +
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}}],` +
		`"tool_choice":"auto","parallel_tool_calls":false,` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object"},"strict":true}},` +
		`"max_completion_tokens":65536,"n":2,"seed":42,"top_p":0.9,"frequency_penalty":0.1,"presence_penalty":0.2,` +
		`"logit_bias":{"50256":-100},"logprobs":true,"top_logprobs":1,"stop":["\n\n"],"user":"u-1","metadata":{"k":"v"},` +
		`"reasoning_effort":"low","store":false,"service_tier":"auto","modalities":["text"],"prediction":{"type":"content","content":"x"},` +
		`"x_vendor_extension":{"kept":true}`
	if stream {
		b += `,"stream":true`
	}
	if usage {
		b += `,"stream_options":{"include_usage":true}`
	}
	return b + `}`
}

// sseData reads a response's `data:` lines, without [DONE].
func sseData(tb testing.TB, r io.Reader) (data []string, done bool) {
	tb.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
	return data, done
}

// withoutID is a JSON object with its id removed (the one member
// Spillway makes its own), for comparison.
func withoutID(tb testing.TB, s string) map[string]any {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		tb.Fatalf("%s: %v", s, err)
	}
	delete(m, "id")
	return m
}

func post(tb testing.TB, url, body string) *http.Response {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.(*testing.T).Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	return resp
}

// proxyPaths are the api settings of each path over one Redis and the
// recording upstream.
func proxyPaths(tb testing.TB, upstream string) map[string]string {
	tb.Helper()
	c := newCluster(tb, fastSim(), map[string]string{"LLM_BASE_URL": upstream + "/v1", "LLM_MODEL": "gpt-up"})
	_, direct := c.api(nil)
	_, queued := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false", "EMBEDDED_WORKERS": "true"})
	return map[string]string{protocol.PathDirect: direct, protocol.PathQueued: queued}
}

func TestProxyForwardsTheRequestAndRelaysTheAnswer(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	for path, url := range proxyPaths(t, up.URL) {
		for _, script := range []string{scriptTools, scriptReasoning, scriptRefusal, scriptChoices} {
			for _, usage := range []bool{true, false} {
				name := path + "/" + script
				body := chatBody(script, true, usage)

				// Straight to the upstream, as the client would.
				straight := post(t, up.URL+"/v1/chat/completions", body)
				want, wantDone := sseData(t, straight.Body)
				straight.Body.Close()

				resp := post(t, url+"/v1/chat/completions", body)
				got, done := sseData(t, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != path {
					t.Fatalf("%s: HTTP %d, path %q", name, resp.StatusCode, resp.Header.Get("X-Stream-Path"))
				}

				// The upstream got the body as sent, with only what
				// Spillway owns changed.
				var sent, received map[string]any
				_ = json.Unmarshal([]byte(body), &sent)
				if err := json.Unmarshal(rec.last(t), &received); err != nil {
					t.Fatalf("%s: upstream body %s: %v", name, rec.last(t), err)
				}
				sent["stream"] = true
				sent["stream_options"] = map[string]any{"include_usage": true}
				if !reflect.DeepEqual(sent, received) {
					t.Errorf("%s: upstream received\n %s\nwant the client's body with stream and include_usage set", name, rec.last(t))
				}

				// The client got every chunk as the upstream sent it,
				// with only the id made ours, one id for the answer.
				if !done || !wantDone || len(got) != len(want) {
					t.Fatalf("%s: got %d chunks (done %v), straight %d (done %v):\n%s", name, len(got), done, len(want), wantDone, strings.Join(got, "\n"))
				}
				id := ""
				for i := range got {
					if !reflect.DeepEqual(withoutID(t, got[i]), withoutID(t, want[i])) {
						t.Errorf("%s: chunk %d\n got %s\nwant %s", name, i, got[i], want[i])
					}
					var c struct{ ID string }
					_ = json.Unmarshal([]byte(got[i]), &c)
					if id == "" {
						id = c.ID
					}
					if c.ID != id || c.ID != "chatcmpl-"+resp.Header.Get("X-Request-ID") {
						t.Errorf("%s: chunk %d id %q, want chatcmpl-%s on every chunk", name, i, c.ID, resp.Header.Get("X-Request-ID"))
					}
				}
			}

			// Not streamed: the object assembled from the chunks equals
			// the upstream's own.
			body := chatBody(script, false, false)
			straight := post(t, up.URL+"/v1/chat/completions", body)
			wantObj, _ := io.ReadAll(straight.Body)
			straight.Body.Close()
			resp := post(t, url+"/v1/chat/completions", body)
			gotObj, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !reflect.DeepEqual(withoutID(t, string(gotObj)), withoutID(t, string(wantObj))) {
				t.Errorf("%s/%s not streamed: HTTP %d\n got %s\nwant %s", path, script, resp.StatusCode, gotObj, wantObj)
			}
		}
	}
}

// An upstream's refusal of the request reaches the client with the
// upstream's status and error object, on both paths, streamed or not.
func TestProxyPassesUpstreamClientErrors(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	for path, url := range proxyPaths(t, up.URL) {
		for _, stream := range []bool{true, false} {
			resp := post(t, url+"/v1/chat/completions", chatBody(scriptReject, stream, false))
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || strings.TrimSpace(string(b)) != rejectBody {
				t.Errorf("%s stream=%v: HTTP %d %s\nwant 400 %s", path, stream, resp.StatusCode, b, rejectBody)
			}
		}
		// /v1/stream: its stream has begun (200 at once), so the error
		// event carries the problem, with the upstream's status and its
		// error object.
		resp := post(t, url+"/v1/stream", `{"messages":[{"role":"user","content":"`+scriptReject+`"}]}`)
		events := readEvents(t, resp.Body)
		resp.Body.Close()
		var p protocol.Problem
		if n := len(events); n == 0 || events[n-1].name != protocol.EventError || json.Unmarshal([]byte(events[n-1].data), &p) != nil {
			t.Fatalf("%s /v1/stream: events %+v, want an error event", path, events)
		}
		if p.Status != http.StatusBadRequest || string(p.UpstreamError) != rejectBody || p.Slug() != protocol.ProblemProviderRejected {
			t.Errorf("%s /v1/stream: problem %+v, want provider-rejected, 400, with the upstream's error", path, p)
		}
	}
}

// /v1/stream carries the same deltas: a tool call's pieces, reasoning, a
// refusal, each choice; done has the finish reason and usage details.
func TestNativeStreamCarriesEveryDelta(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	for path, url := range proxyPaths(t, up.URL) {
		for script, want := range map[string][]string{
			scriptTools: {
				`{"content":"","tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"get_weather","arguments":""}}],"choice":0}`,
				`{"content":"","tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}],"choice":0}`,
				`{"content":"","tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}],"choice":0}`,
			},
			scriptReasoning: {
				`{"content":"","reasoning":"Two and two","choice":0}`,
				`{"content":"","reasoning":" make four.","choice":0}`,
				`{"content":"4","logprobs":{"content":[{"token":"4","logprob":-0.01,"bytes":[52],"top_logprobs":[]}],"refusal":null},"choice":0}`,
			},
			scriptChoices: {`{"content":"Yes","choice":0}`, `{"content":"No","choice":1}`},
		} {
			resp := post(t, url+"/v1/stream", strings.Replace(chatBody(script, false, false), `"n":2`, `"n":2,"thread_id":"t1"`, 1))
			events := readEvents(t, resp.Body)
			resp.Body.Close()
			var data []string
			var done string
			for _, e := range events {
				switch e.name {
				case "":
					data = append(data, e.data)
				case protocol.EventDone:
					done = e.data
				}
			}
			if !reflect.DeepEqual(data, want) {
				t.Errorf("%s %s: events\n %s\nwant\n %s", path, script, strings.Join(data, "\n "), strings.Join(want, "\n "))
			}
			var d protocol.Done
			if err := json.Unmarshal([]byte(done), &d); err != nil || d.Usage == nil {
				t.Fatalf("%s %s: done %q", path, script, done)
			}
			if script == scriptTools && (d.FinishReason != "tool_calls" || d.Usage.CompletionTokensDetails != `{"reasoning_tokens":0}`) {
				t.Errorf("%s: done %s, want finish tool_calls and the usage details", path, done)
			}
		}
		// thread_id is Spillway's: it never reaches the upstream.
		if bytes.Contains(rec.last(t), []byte("thread_id")) {
			t.Errorf("%s: the upstream received thread_id: %s", path, rec.last(t))
		}
	}
}

type sseEvent struct{ id, name, data string }

func readEvents(tb testing.TB, r io.Reader) []sseEvent {
	tb.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			cur.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		}
	}
	return out
}

// The official Go SDK runs a tool call through Spillway on both paths:
// the streamed tool call accumulates into the upstream's call, and the
// next turn (the assistant's tool_calls, the tool's answer) is accepted
// and forwarded.
func TestOpenAIGoSDKToolCallBothPaths(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	for path, url := range proxyPaths(t, up.URL) {
		client := sdkClient(url)
		params := openai.ChatCompletionNewParams{
			Model: "gpt-up",
			Messages: []openai.ChatCompletionMessageParamUnion{
				openai.UserMessage("What is the weather in Paris?"),
				openai.AssistantMessage("Let me check."),
				openai.ToolMessage(`{"temp":21}`, "call_0"),
				openai.UserMessage(scriptTools),
			},
			Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
				Name: "get_weather", Parameters: openai.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
			})},
		}
		s := client.Chat.Completions.NewStreaming(context.Background(), params)
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if err := s.Err(); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(acc.Choices) != 1 || len(acc.Choices[0].Message.ToolCalls) != 1 ||
			acc.Choices[0].Message.ToolCalls[0].Function.Name != "get_weather" ||
			acc.Choices[0].Message.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` || acc.Choices[0].FinishReason != "tool_calls" {
			t.Fatalf("%s: accumulated %+v", path, acc.Choices)
		}
		comp, err := client.Chat.Completions.New(context.Background(), params)
		if err != nil || len(comp.Choices) != 1 || comp.Choices[0].Message.ToolCalls[0].ID != "call_abc" ||
			comp.Usage.CompletionTokensDetails.ReasoningTokens != 0 || comp.JSON.SystemFingerprint.Raw() != `"fp_up"` {
			t.Fatalf("%s: not streamed: %v %s", path, err, comp.RawJSON())
		}
		var sent struct {
			Tools    []json.RawMessage `json:"tools"`
			Messages []json.RawMessage `json:"messages"`
		}
		_ = json.Unmarshal(rec.last(t), &sent)
		if len(sent.Tools) != 1 || len(sent.Messages) != 4 || !bytes.Contains(sent.Messages[2], []byte(`"tool_call_id":"call_0"`)) {
			t.Errorf("%s: upstream received %s", path, rec.last(t))
		}
	}
}
