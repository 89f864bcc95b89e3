package simserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

const seed = 5

func start(tb testing.TB, cfg llm.SimConfig) (*simserver.Server, *httptest.Server) {
	tb.Helper()
	sim, err := llm.NewSim(cfg)
	if err != nil {
		tb.Fatalf("NewSim: %v", err)
	}
	srv := simserver.New(sim, nil)
	hs := httptest.NewServer(srv)
	tb.Cleanup(hs.Close)
	return srv, hs
}

func post(tb testing.TB, url, body string) *http.Response {
	tb.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		tb.Fatalf("POST: %v", err)
	}
	tb.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decode[T any](tb testing.TB, r io.Reader) T {
	tb.Helper()
	var v T
	if err := json.NewDecoder(r).Decode(&v); err != nil {
		tb.Fatalf("decode: %v", err)
	}
	return v
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message      protocol.Message `json:"message"`
		FinishReason string           `json:"finish_reason"`
	} `json:"choices"`
	Usage protocol.Usage `json:"usage"`
}

func TestNonStreaming(t *testing.T) {
	t.Parallel()
	msgs := []protocol.Message{{Role: "user", Content: "say something nice"}}
	tests := []struct {
		name   string
		body   string
		model  string
		chunks int
		finish string
	}{
		{"default", `{"messages":[{"role":"user","content":"say something nice"}]}`, "sim-1", 12, "stop"},
		{"stream false, model echoed", `{"model":"gpt-x","stream":false,"messages":[{"role":"user","content":"say something nice"}]}`, "gpt-x", 12, "stop"},
		{"max_tokens", `{"max_tokens":4,"messages":[{"role":"user","content":"say something nice"}]}`, "sim-1", 4, "length"},
	}
	_, hs := start(t, llm.SimConfig{Tokens: 12, Seed: seed})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp := post(t, hs.URL, tc.body)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			c := decode[completion](t, resp.Body)
			want := strings.Join(llm.SimChunks(msgs, seed, 12)[:tc.chunks], "")
			if c.Object != "chat.completion" || c.Model != tc.model || !strings.HasPrefix(c.ID, "chatcmpl-") || len(c.Choices) != 1 {
				t.Fatalf("completion %+v", c)
			}
			if got := c.Choices[0]; got.Message != (protocol.Message{Role: "assistant", Content: want}) || got.FinishReason != tc.finish {
				t.Errorf("choice %+v, want %q %s", got, want, tc.finish)
			}
			if c.Usage != (protocol.Usage{PromptTokens: 3, CompletionTokens: tc.chunks, TotalTokens: 3 + tc.chunks}) {
				t.Errorf("usage %+v", c.Usage)
			}
		})
	}
}

type sseChunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *protocol.Usage `json:"usage"`
}

// readEvents reads the raw SSE body: every event must be one `data:` line
// followed by a blank line.
func readEvents(tb testing.TB, r io.Reader) []string {
	tb.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			tb.Fatalf("line %q is not a data line", line)
		}
		if !sc.Scan() || sc.Text() != "" {
			tb.Fatalf("event %q not followed by a blank line", line)
		}
		events = append(events, data)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return events
}

func TestStreaming(t *testing.T) {
	t.Parallel()
	msgs := []protocol.Message{{Role: "system", Content: "be kind"}, {Role: "user", Content: "hello"}}
	const reqMsgs = `"messages":[{"role":"system","content":"be kind"},{"role":"user","content":"hello"}]`
	tests := []struct {
		name   string
		body   string
		chunks int
		finish string
		usage  bool
	}{
		{"plain", `{"stream":true,` + reqMsgs + `}`, 9, "stop", false},
		{"with usage", `{"stream":true,"stream_options":{"include_usage":true},` + reqMsgs + `}`, 9, "stop", true},
		{"usage off", `{"stream":true,"stream_options":{"include_usage":false},` + reqMsgs + `}`, 9, "stop", false},
		{"max_tokens", `{"stream":true,"max_tokens":2,"stream_options":{"include_usage":true},` + reqMsgs + `}`, 2, "length", true},
	}
	_, hs := start(t, llm.SimConfig{Tokens: 9, Seed: seed})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp := post(t, hs.URL, tc.body)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			events := readEvents(t, resp.Body)
			want := llm.SimChunks(msgs, seed, 9)[:tc.chunks]
			n := len(want) + 2 // chunks, finish, [DONE]
			if tc.usage {
				n++
			}
			if len(events) != n || events[len(events)-1] != "[DONE]" {
				t.Fatalf("got %d events ending %q, want %d ending [DONE]", len(events), events[len(events)-1], n)
			}
			for i, w := range want {
				c := decode[sseChunk](t, strings.NewReader(events[i]))
				if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 || c.Choices[0].Delta.Content != w || c.Choices[0].FinishReason != nil {
					t.Errorf("event %d = %s, want content %q", i, events[i], w)
				}
				if role := c.Choices[0].Delta.Role; (i == 0) != (role == "assistant") {
					t.Errorf("event %d role %q", i, role)
				}
			}
			fin := decode[sseChunk](t, strings.NewReader(events[len(want)]))
			if len(fin.Choices) != 1 || fin.Choices[0].FinishReason == nil || *fin.Choices[0].FinishReason != tc.finish || fin.Choices[0].Delta.Content != "" {
				t.Errorf("finish event %s, want finish_reason %q", events[len(want)], tc.finish)
			}
			if tc.usage {
				u := decode[sseChunk](t, strings.NewReader(events[len(want)+1]))
				wantU := protocol.Usage{PromptTokens: 3, CompletionTokens: tc.chunks, TotalTokens: 3 + tc.chunks}
				if u.Usage == nil || *u.Usage != wantU || u.Choices == nil || len(u.Choices) != 0 {
					t.Errorf("usage event %s, want %+v and empty choices", events[len(want)+1], wantU)
				}
			}
		})
	}
}

type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		body   string
		status int
	}{
		{"not JSON", `{"messages":`, 400},
		{"array", `[1,2]`, 400},
		{"empty", ``, 400},
		{"no messages", `{"model":"sim-1"}`, 400},
		{"empty messages", `{"messages":[]}`, 400},
		{"message without role", `{"messages":[{"content":"hi"}]}`, 400},
		{"content not a string", `{"messages":[{"role":"user","content":5}]}`, 400},
		{"zero max_tokens", `{"max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, 400},
		{"negative max_tokens", `{"max_tokens":-3,"messages":[{"role":"user","content":"hi"}]}`, 400},
		{"temperature", `{"temperature":3,"messages":[{"role":"user","content":"hi"}]}`, 400},
		{"too large", `{"messages":[{"role":"user","content":"` + strings.Repeat("a", 5<<20) + `"}]}`, 413},
	}
	srv, hs := start(t, llm.SimConfig{Tokens: 3, Seed: seed})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp := post(t, hs.URL, tc.body)
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d %q, want %d application/json", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status)
			}
			e := decode[apiError](t, resp.Body)
			if e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
				t.Errorf("error %+v", e)
			}
		})
	}
	t.Cleanup(func() {
		if got := srv.Requests(); got != int64(len(tests)) {
			t.Errorf("Requests() = %d, want %d", got, len(tests))
		}
	})
}

func TestProviderFailureStatus(t *testing.T) {
	t.Parallel()
	for _, streaming := range []string{"true", "false"} {
		t.Run("stream="+streaming, func(t *testing.T) {
			t.Parallel()
			srv, hs := start(t, llm.SimConfig{Tokens: 3, FailRate: 1})
			resp := post(t, hs.URL, `{"stream":`+streaming+`,"messages":[{"role":"user","content":"hi"}]}`)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503", resp.StatusCode)
			}
			e := decode[apiError](t, resp.Body)
			if e.Error.Type != "server_error" || strings.Contains(e.Error.Message, "sim:") {
				t.Errorf("error %+v", e)
			}
			if srv.Cancelled() != 0 || srv.Active() != 0 || srv.Requests() != 1 {
				t.Errorf("counters requests=%d cancelled=%d active=%d", srv.Requests(), srv.Cancelled(), srv.Active())
			}
		})
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	t.Parallel()
	_, hs := start(t, llm.SimConfig{Tokens: 3, Seed: seed})
	get := func(path string) *http.Response {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		return resp
	}
	models := decode[struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}](t, get("/v1/models").Body)
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "sim-1" || models.Data[0].Object != "model" {
		t.Errorf("models %+v", models)
	}
	get("/healthz")

	post(t, hs.URL, `{"messages":[{"role":"user","content":"hi"}]}`)
	post(t, hs.URL, `{"messages":[]}`)
	body, _ := io.ReadAll(get("/metrics").Body)
	for _, want := range []string{
		"# TYPE simllm_requests_total counter", "simllm_requests_total 2\n",
		"# TYPE simllm_cancelled_total counter", "simllm_cancelled_total 0\n",
		"# TYPE simllm_active_streams gauge", "simllm_active_streams 0\n",
		"# TYPE simllm_active_streams_peak gauge", "simllm_active_streams_peak 1\n",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}

	resp, err := http.Get(hs.URL + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/chat/completions: %d, want 405", resp.StatusCode)
	}
}

// TestCancelled checks that a client leaving before the answer is complete
// is counted, streaming or not, and that the handler stops.
func TestCancelled(t *testing.T) {
	t.Parallel()
	for _, streaming := range []string{"true", "false"} {
		t.Run("stream="+streaming, func(t *testing.T) {
			t.Parallel()
			srv, hs := start(t, llm.SimConfig{FirstToken: time.Hour, Tokens: 3})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions",
				strings.NewReader(`{"stream":`+streaming+`,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
			waitFor(t, 5*time.Second, "the answer is active", func() bool { return srv.Active() == 1 })
			if srv.Cancelled() != 0 {
				t.Fatalf("Cancelled() = %d before cancel", srv.Cancelled())
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("client err = %v", err)
			}
			waitFor(t, 5*time.Second, "the cancellation is counted", func() bool {
				return srv.Cancelled() == 1 && srv.Active() == 0
			})
		})
	}
}

// waitFor checks cond on a short ticker until it holds or timeout passes.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	testutil.Eventually(tb, timeout, cond, what)
}

// TestThrottledWithRetryAfter: the first calls are refused 429 with a
// Retry-After in seconds, which the OpenAI client reads back.
func TestThrottledWithRetryAfter(t *testing.T) {
	t.Parallel()
	srv, hs := start(t, llm.SimConfig{Tokens: 3, FailFirst: 2, FailStatus: 429, FailRetryAfter: 2 * time.Second})
	resp := post(t, hs.URL, `{"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("status %d Retry-After %q, want 429 and 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	c, err := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: hs.URL + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Stream(t.Context(), protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "hi"}}}, func(protocol.Chunk) error { return nil })
	if d, ok := (llm.RetryPolicy{}).Delay(err, 1); !ok || d != 2*time.Second || llm.CountsAgainstBreaker(err) {
		t.Errorf("err %v: Delay %v, %v; want 2s, and not a breaker failure", err, d, ok)
	}
	if _, err := c.Stream(t.Context(), protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "hi"}}}, func(protocol.Chunk) error { return nil }); err != nil {
		t.Errorf("third call: %v", err)
	}
	if srv.Throttled() != 2 || srv.Requests() != 3 {
		t.Errorf("throttled %d of %d requests, want 2 of 3", srv.Throttled(), srv.Requests())
	}
}

// TestStallCutByIdleTimeout: a stalled stream is cut by the client's idle
// timeout, and the server sees the client leave.
func TestStallCutByIdleTimeout(t *testing.T) {
	t.Parallel()
	srv, hs := start(t, llm.SimConfig{Tokens: 10, Seed: seed, StallAfter: 2})
	c, err := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: hs.URL + "/v1", FirstTokenTimeout: time.Second, IdleTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	_, err = c.Stream(t.Context(), protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "hi"}}}, func(protocol.Chunk) error { n++; return nil })
	if !errors.Is(err, llm.ErrIdleTimeout) || n != 2 {
		t.Fatalf("err %v after %d chunks, want ErrIdleTimeout after 2", err, n)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return srv.Cancelled() == 1 && srv.Active() == 0 }, "the server sees the client leave")
}

// TestConcurrencyLimit: with two slow answers in flight, a third request
// is answered 429 at once.
func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	srv, hs := start(t, llm.SimConfig{FirstToken: time.Hour, Tokens: 3, Seed: seed, MaxConcurrency: 2, FailRetryAfter: time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions",
			strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return srv.Active() == 2 }, "two answers in flight")
	resp := post(t, hs.URL, `{"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || srv.Throttled() != 1 {
		t.Errorf("status %d Retry-After %q throttled %d, want 429, 1 and 1", resp.StatusCode, resp.Header.Get("Retry-After"), srv.Throttled())
	}
	cancel()
	testutil.Eventually(t, 5*time.Second, func() bool { return srv.Active() == 0 }, "the slow answers end")
}
