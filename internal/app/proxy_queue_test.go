package app

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// toolRequest is a /v1/stream request offering a tool: the simulator
// calls it with these arguments, streamed in pieces. Only the raw body
// carries the tool, so a tool call in the answer proves the body
// travelled whole.
const toolRequest = `{"messages":[{"role":"user","content":[{"type":"text","text":"Weather in Paris? SIM_TOOL_ARGS={\"city\":\"Paris\",\"unit\":\"celsius\"}"},` +
	`{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]}],` +
	`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`

// toolCall joins the tool call /v1/stream events carry after the last
// reset: its name and arguments, and the done event's finish reason.
func toolCall(tb testing.TB, events []sseEvent) (name, args, finish string, resets int) {
	tb.Helper()
	for _, e := range events {
		switch e.name {
		case protocol.EventReset:
			name, args, resets = "", "", resets+1
		case "":
			var d struct {
				ToolCalls []struct {
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			if err := json.Unmarshal([]byte(e.data), &d); err != nil {
				tb.Fatalf("event %s: %v", e.data, err)
			}
			for _, tc := range d.ToolCalls {
				name += tc.Function.Name
				args += tc.Function.Arguments
			}
		case protocol.EventDone:
			var d protocol.Done
			_ = json.Unmarshal([]byte(e.data), &d)
			finish = d.FinishReason
		}
	}
	return name, args, finish, resets
}

// The raw job travels through Kafka as through Redis Streams: a tool
// call and an image part reach the worker's upstream, and the call comes
// back, on /v1/stream and /v1/chat/completions.
func TestKafkaCarriesTheRawJob(t *testing.T) {
	t.Parallel()
	c, _ := kafkaCluster(t, fastSim(), nil)
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	c.consumer(nil)

	resp := post(t, url+"/v1/stream", toolRequest)
	events := readEvents(t, resp.Body)
	resp.Body.Close()
	name, args, finish, _ := toolCall(t, events)
	if resp.Header.Get("X-Stream-Path") != protocol.PathQueued || name != "get_weather" ||
		args != `{"city":"Paris","unit":"celsius"}` || finish != "tool_calls" {
		t.Fatalf("path %q: call %s(%s), finish %q; events %+v", resp.Header.Get("X-Stream-Path"), name, args, finish, events)
	}

	body := strings.Replace(toolRequest, `{"messages"`, `{"model":"sim","messages"`, 1)
	resp = post(t, url+"/v1/chat/completions", body)
	var comp struct {
		Choices []struct {
			Message struct {
				ToolCalls []struct {
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			FinishReason string `json:"finish_reason"`
		}
	}
	err := json.NewDecoder(resp.Body).Decode(&comp)
	resp.Body.Close()
	if err != nil || len(comp.Choices) != 1 || len(comp.Choices[0].Message.ToolCalls) != 1 ||
		comp.Choices[0].Message.ToolCalls[0].Function.Arguments != `{"city":"Paris","unit":"celsius"}` || comp.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("completion over Kafka: %v %+v", err, comp)
	}
}

// A worker killed in the middle of a tool-call answer: another takes the
// job over, sends reset, and the client still gets the whole call; a
// resume of the finished stream on another api gives back the same
// events, byte for byte.
func TestTakeoverAndResumeMidToolCall(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 400 * time.Millisecond, Tokens: 8, Seed: 21}
	c := newCluster(t, sc, nil)
	_, urlA := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	_, urlB := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	first := c.consumer(nil)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urlA+"/v1/stream", strings.NewReader(toolRequest))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	id := resp.Header.Get("X-Request-ID")

	// Read until the first piece of the call, then kill its worker.
	var raw strings.Builder
	sc2 := bufio.NewScanner(resp.Body)
	sc2.Buffer(make([]byte, 0, 64<<10), 1<<20)
	killed := false
	for sc2.Scan() {
		line := sc2.Text()
		raw.WriteString(line + "\n")
		if !killed && strings.Contains(line, `"tool_calls"`) {
			c.consumer(nil)
			first.Kill()
			killed = true
		}
	}
	if !killed {
		t.Fatalf("no tool call before the end: %s", raw.String())
	}
	events := readEvents(t, strings.NewReader(raw.String()))
	name, args, finish, resets := toolCall(t, events)
	if name != "get_weather" || args != `{"city":"Paris","unit":"celsius"}` || finish != "tool_calls" || resets < 1 {
		t.Fatalf("after the takeover: call %s(%s), finish %q, %d resets; stream:\n%s", name, args, finish, resets, raw.String())
	}

	// The same events, from the log, on another api.
	again := streamReq(t, t.Context(), http.MethodGet, urlB, id, "alice", 0)
	defer again.Body.Close()
	replayed := readEvents(t, again.Body)
	if len(replayed) != len(events) {
		t.Fatalf("resume gave %d events, the stream had %d", len(replayed), len(events))
	}
	for i := range events {
		if replayed[i] != events[i] {
			t.Fatalf("event %d resumed as %+v, sent as %+v", i, replayed[i], events[i])
		}
	}
}

// A streamed legacy completion is relayed chunk by chunk on both paths:
// the upstream gets the body as sent, the client every chunk as it came
// (the upstream's ids kept), then [DONE].
func TestStreamedCompletionsRelayed(t *testing.T) {
	t.Parallel()
	chunks := []string{
		`{"id":"cmpl-up","object":"text_completion","created":1700000000,"model":"instruct","choices":[{"text":"This","index":0,"logprobs":null,"finish_reason":null}]}`,
		`{"id":"cmpl-up","object":"text_completion","created":1700000000,"model":"instruct","choices":[{"text":" is a test","index":0,"logprobs":null,"finish_reason":null}]}`,
		`{"id":"cmpl-up","object":"text_completion","created":1700000000,"model":"instruct","choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"stop"}]}`,
	}
	var mu sync.Mutex
	var got [][]byte
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, b)
		mu.Unlock()
		if r.URL.Path != "/v1/completions" {
			http.Error(w, `{"error":{"message":"wrong path"}}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			_, _ = io.WriteString(w, "data: "+c+"\n\n")
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	body := `{"model":"instruct","prompt":"Say this is a test","max_tokens":7,"stream":true,"echo":false}`
	for path, url := range proxyPaths(t, up.URL) {
		resp := post(t, url+"/v1/completions", body)
		data, done := sseData(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != path || !done || !slices.Equal(data, chunks) {
			t.Fatalf("%s: HTTP %d path %q done %v, chunks\n%s", path, resp.StatusCode, resp.Header.Get("X-Stream-Path"), done, strings.Join(data, "\n"))
		}
		mu.Lock()
		last := string(got[len(got)-1])
		mu.Unlock()
		if last != body {
			t.Errorf("%s: upstream received %s, want the body as sent", path, last)
		}
	}
}
