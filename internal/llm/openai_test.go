package llm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// startSimServer runs simserver on a simulator configured by cfg.
func startSimServer(tb testing.TB, cfg llm.SimConfig) (*simserver.Server, *httptest.Server) {
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

func newClient(tb testing.TB, cfg llm.OpenAIConfig) *llm.OpenAI {
	tb.Helper()
	c, err := llm.NewOpenAI(cfg)
	if err != nil {
		tb.Fatalf("NewOpenAI: %v", err)
	}
	return c
}

func stream(tb testing.TB, ctx context.Context, p llm.Provider, req protocol.ChatRequest) ([]string, llm.Result, error) {
	tb.Helper()
	var got []string
	res, err := p.Stream(ctx, req, func(chunk protocol.Chunk) error {
		// The content chunks; the others (role preamble, finish, usage)
		// travel as raw only.
		if chunk.Content != "" {
			got = append(got, chunk.Content)
		}
		return nil
	})
	return got, res, err
}

func userReq(s string) protocol.ChatRequest {
	return protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: s}}}
}

func TestOpenAIAgainstSimServer(t *testing.T) {
	t.Parallel()
	cfg := llm.SimConfig{Tokens: 48, Seed: 42}
	_, hs := startSimServer(t, cfg)
	sim, _ := llm.NewSim(cfg)
	temp := 0.2
	tests := []struct {
		name string
		req  protocol.ChatRequest
		base string
	}{
		{"one message", userReq("Hello"), hs.URL + "/v1"},
		{"trailing slash", userReq("Hello"), hs.URL + "/v1/"},
		{"conversation", protocol.ChatRequest{Model: "sim-1", Temperature: &temp, Messages: []protocol.Message{
			{Role: "system", Content: "You are terse."},
			{Role: "user", Content: "Ünïcödé and\nnew lines"},
			{Role: "assistant", Content: "ok"},
			{Role: "user", Content: "again"},
		}}, hs.URL + "/v1"},
		{"max_tokens", protocol.ChatRequest{MaxTokens: 7, Messages: userReq("Hello").Messages}, hs.URL + "/v1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t, llm.OpenAIConfig{BaseURL: tc.base, Timeout: 10 * time.Second})
			got, res, err := stream(t, t.Context(), c, tc.req)
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			want, wantRes, err := stream(t, t.Context(), sim, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("chunks\n got %q\nwant %q", got, want)
			}
			if full := llm.SimChunks(tc.req.Messages, 42, 48); !slices.Equal(got, full[:len(got)]) {
				t.Errorf("chunks are not a prefix of SimChunks")
			}
			if res != wantRes {
				t.Errorf("result %+v, want %+v (the simulator's own)", res, wantRes)
			}
		})
	}
}

// upstream serves handler and returns a client of it.
func upstream(tb testing.TB, handler http.HandlerFunc) *llm.OpenAI {
	tb.Helper()
	hs := httptest.NewServer(handler)
	tb.Cleanup(hs.Close)
	return newClient(tb, llm.OpenAIConfig{BaseURL: hs.URL + "/v1", Timeout: 10 * time.Second})
}

func TestOpenAIRequestShape(t *testing.T) {
	t.Parallel()
	type captured struct {
		method, path, auth, ctype, accept string
		body                              map[string]any
	}
	got := make(chan captured, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := captured{method: r.Method, path: r.URL.Path, auth: r.Header.Get("Authorization"),
			ctype: r.Header.Get("Content-Type"), accept: r.Header.Get("Accept")}
		_ = json.NewDecoder(r.Body).Decode(&c.body)
		got <- c
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(hs.Close)
	c := newClient(t, llm.OpenAIConfig{BaseURL: hs.URL + "/v1/", APIKey: "sk-test", Model: "fallback-model"})
	temp := 0.7
	if _, _, err := stream(t, t.Context(), c, protocol.ChatRequest{
		Messages: []protocol.Message{{Role: "user", Content: "hi"}}, MaxTokens: 12, Temperature: &temp,
	}); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.method != http.MethodPost || r.path != "/v1/chat/completions" || r.auth != "Bearer sk-test" ||
		r.ctype != "application/json" || r.accept != "text/event-stream" {
		t.Errorf("request %s %s auth=%q content-type=%q accept=%q", r.method, r.path, r.auth, r.ctype, r.accept)
	}
	want := map[string]any{
		"model":          "fallback-model",
		"messages":       []any{map[string]any{"role": "user", "content": "hi"}},
		"max_tokens":     12.0,
		"temperature":    0.7,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if fmt.Sprint(r.body) != fmt.Sprint(want) {
		t.Errorf("body %v\nwant %v", r.body, want)
	}
}

func TestOpenAIStatusErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status     int
		retryAfter string
		retryable  bool
		wantAfter  time.Duration // exact, or a lower bound with tolerance for dates
		isDate     bool
	}{
		{429, "2", true, 2 * time.Second, false},
		{429, "date", true, 90 * time.Second, true},
		{429, "", true, 0, false},
		{503, "", true, 0, false},
		{503, "garbage", true, 0, false},
		{500, "", true, 0, false},
		{502, "1", true, time.Second, false},
		{400, "", false, 0, false},
		{401, "", false, 0, false},
		{404, "", false, 0, false},
		{400, "5", false, 0, false}, // Retry-After only matters when a retry may help
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d_%s", tc.status, tc.retryAfter), func(t *testing.T) {
			t.Parallel()
			c := upstream(t, func(w http.ResponseWriter, r *http.Request) {
				switch {
				case tc.isDate:
					// Dated when answering, not when the test started: on
					// a loaded machine seconds pass before the request.
					w.Header().Set("Retry-After", time.Now().Add(tc.wantAfter).UTC().Format(http.TimeFormat))
				case tc.retryAfter != "":
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				io.WriteString(w, `{"error":{"message":"upstream says `+strings.Repeat("x", 2000)+`"}}`)
			})
			got, _, err := stream(t, t.Context(), c, userReq("hi"))
			var e *llm.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *llm.Error", err)
			}
			if e.Status != tc.status || e.Retryable != tc.retryable || llm.IsRetryable(err) != tc.retryable {
				t.Errorf("got status %d retryable %v, want %d %v", e.Status, e.Retryable, tc.status, tc.retryable)
			}
			if tc.isDate {
				if e.RetryAfter < tc.wantAfter-5*time.Second || e.RetryAfter > tc.wantAfter {
					t.Errorf("RetryAfter %v, want about %v", e.RetryAfter, tc.wantAfter)
				}
			} else if e.RetryAfter != tc.wantAfter {
				t.Errorf("RetryAfter %v, want %v", e.RetryAfter, tc.wantAfter)
			}
			if len(got) != 0 {
				t.Errorf("emitted %q", got)
			}
			if len(err.Error()) > 1000 {
				t.Errorf("error text not truncated: %d bytes", len(err.Error()))
			}
		})
	}
}

// sseHandler answers with the given raw stream body.
func sseHandler(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		io.WriteString(w, body)
	}
}

func TestOpenAIStreamParsing(t *testing.T) {
	t.Parallel()
	const usage = `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}` + "\n\n"
	tests := []struct {
		name      string
		body      string
		chunks    []string
		res       llm.Result
		retryable bool
		fail      bool
	}{
		{
			name: "usage from upstream",
			body: "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"lo\\nthere\"},\"finish_reason\":null}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n" + usage + "data: [DONE]\n\n",
			chunks: []string{"Hel", "lo\nthere"},
			res:    llm.Result{FinishReason: "length", Usage: protocol.Usage{PromptTokens: 3, CompletionTokens: 2, TotalTokens: 5}},
		},
		{
			name: "no usage counts chunks",
			body: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\":\"c\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
			chunks: []string{"a", "b", "c"},
			res:    llm.Result{FinishReason: "stop", Usage: protocol.Usage{CompletionTokens: 3, TotalTokens: 3}},
		},
		{
			name: "comments, other fields, CRLF, no space after colon",
			body: ": keep-alive\r\nretry: 100\r\nid: 1\r\nevent: message\r\ndata:{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\r\n\r\n" +
				": ping\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"y\"}}]}\n\ndata: [DONE]\n\n",
			chunks: []string{"x", "y"},
			res:    llm.Result{FinishReason: "stop", Usage: protocol.Usage{CompletionTokens: 2, TotalTokens: 2}},
		},
		{
			name:   "[DONE] without final blank line",
			body:   "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]",
			chunks: []string{"x"},
			res:    llm.Result{FinishReason: "stop", Usage: protocol.Usage{CompletionTokens: 1, TotalTokens: 1}},
		},
		{
			name:   "finish reason then EOF without [DONE]",
			body:   "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\n",
			chunks: []string{"x"},
			res:    llm.Result{FinishReason: "stop", Usage: protocol.Usage{CompletionTokens: 1, TotalTokens: 1}},
		},
		{
			name:      "EOF mid-answer",
			body:      "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n",
			chunks:    []string{"x"},
			fail:      true,
			retryable: true,
		},
		{
			name:      "empty body",
			body:      "",
			fail:      true,
			retryable: true,
		},
		{
			name:      "error event",
			body:      "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n",
			chunks:    []string{"x"},
			fail:      true,
			retryable: true,
		},
		{
			name:   "malformed JSON",
			body:   "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {not json\n\n",
			chunks: []string{"x"},
			fail:   true,
		},
		{
			name: "line over 1 MiB",
			body: "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("a", 1<<20) + "\"}}]}\n\ndata: [DONE]\n\n",
			fail: true,
		},
		{
			name: "event over 1 MiB in many lines",
			body: strings.Repeat("data: "+strings.Repeat("a", 1000)+"\n", 1100) + "\n",
			fail: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := upstream(t, sseHandler(tc.body))
			got, res, err := stream(t, t.Context(), c, userReq("hi"))
			if !slices.Equal(got, tc.chunks) {
				t.Errorf("chunks %q, want %q", got, tc.chunks)
			}
			if !tc.fail {
				if err != nil {
					t.Fatalf("Stream: %v", err)
				}
				if res != tc.res {
					t.Errorf("result %+v, want %+v", res, tc.res)
				}
				return
			}
			var e *llm.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *llm.Error", err)
			}
			if e.Retryable != tc.retryable {
				t.Errorf("retryable = %v, want %v (%v)", e.Retryable, tc.retryable, err)
			}
		})
	}
}

func TestOpenAIWrongContentType(t *testing.T) {
	t.Parallel()
	c := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
	})
	_, _, err := stream(t, t.Context(), c, userReq("hi"))
	var e *llm.Error
	if !errors.As(err, &e) || e.Retryable {
		t.Errorf("err = %v, want a permanent *llm.Error", err)
	}
}

// TestOpenAIServerClosesMidstream drops the connection after two events,
// once from a hand-written handler and once from simserver's midstream
// fault.
func TestOpenAIServerClosesMidstream(t *testing.T) {
	t.Parallel()
	t.Run("handler", func(t *testing.T) {
		t.Parallel()
		c := upstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n")
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		})
		got, _, err := stream(t, t.Context(), c, userReq("hi"))
		if !llm.IsRetryable(err) || !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("got %q and %v, want a, b and a retryable error", got, err)
		}
	})
	t.Run("simserver", func(t *testing.T) {
		t.Parallel()
		_, hs := startSimServer(t, llm.SimConfig{Tokens: 10, Seed: 1, FailMidstreamRate: 1})
		c := newClient(t, llm.OpenAIConfig{BaseURL: hs.URL + "/v1"})
		got, _, err := stream(t, t.Context(), c, userReq("hi"))
		if !llm.IsRetryable(err) || len(got) != 5 {
			t.Errorf("got %d chunks and %v, want 5 and a retryable error", len(got), err)
		}
		if errors.Is(err, context.Canceled) {
			t.Errorf("err %v claims cancellation", err)
		}
	})
	t.Run("simserver before first chunk", func(t *testing.T) {
		t.Parallel()
		_, hs := startSimServer(t, llm.SimConfig{Tokens: 10, Seed: 1, FailRate: 1})
		c := newClient(t, llm.OpenAIConfig{BaseURL: hs.URL + "/v1"})
		_, _, err := stream(t, t.Context(), c, userReq("hi"))
		var e *llm.Error
		if !errors.As(err, &e) || !e.Retryable || e.Status != http.StatusServiceUnavailable {
			t.Errorf("err = %v, want retryable with status 503", err)
		}
	})
}

func TestOpenAIConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := newClient(t, llm.OpenAIConfig{BaseURL: "http://" + addr + "/v1"})
	_, _, err = stream(t, t.Context(), c, userReq("hi"))
	var e *llm.Error
	if !errors.As(err, &e) || !e.Retryable || e.Status != 0 {
		t.Errorf("err = %v, want retryable without status", err)
	}
}

// TestOpenAITimeout cuts a call that hangs upstream with the client's own
// Timeout: retryable, and not mistaken for the caller's cancellation.
func TestOpenAITimeout(t *testing.T) {
	t.Parallel()
	for _, midstream := range []bool{false, true} {
		t.Run(fmt.Sprint("midstream=", midstream), func(t *testing.T) {
			t.Parallel()
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body) // lets the server see the client leave
				if midstream {
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
					http.NewResponseController(w).Flush()
				}
				<-r.Context().Done()
			}))
			t.Cleanup(hs.Close)
			c := newClient(t, llm.OpenAIConfig{BaseURL: hs.URL + "/v1", Timeout: 100 * time.Millisecond})
			start := time.Now()
			_, _, err := stream(t, t.Context(), c, userReq("hi"))
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("returned after %v", d)
			}
			if !llm.IsRetryable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want retryable and not a context error", err)
			}
		})
	}
}

// TestOpenAICancel cancels the caller's context while simserver waits an
// hour for a chunk: the client returns promptly with the context's error
// and simserver sees the disconnect.
func TestOpenAICancel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    llm.SimConfig
		chunks int // seen before cancelling
	}{
		{"before headers", llm.SimConfig{FirstToken: time.Hour, Tokens: 10, Seed: 1}, 0},
		{"mid-stream", llm.SimConfig{TokenInterval: time.Hour, Tokens: 10, Seed: 1}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, hs := startSimServer(t, tc.cfg)
			c := newClient(t, llm.OpenAIConfig{BaseURL: hs.URL + "/v1"})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			seen := make(chan struct{}, tc.cfg.Tokens)
			done := make(chan error, 1)
			go func() {
				_, err := c.Stream(ctx, userReq("hi"), func(protocol.Chunk) error {
					seen <- struct{}{}
					return nil
				})
				done <- err
			}()
			for range tc.chunks {
				<-seen
			}
			waitFor(t, 5*time.Second, "the server is answering", func() bool { return srv.Active() == 1 })
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) || llm.IsRetryable(err) {
					t.Errorf("err = %v, want context.Canceled, not retryable", err)
				}
			case <-time.After(time.Second):
				t.Fatal("client did not return within 1s of cancel")
			}
			if len(seen) != 0 {
				t.Errorf("%d chunks arrived after the cancel", len(seen))
			}
			waitFor(t, 5*time.Second, "the server counts the cancellation", func() bool {
				return srv.Cancelled() == 1 && srv.Active() == 0
			})
			if got := srv.Requests(); got != 1 {
				t.Errorf("Requests() = %d, want 1", got)
			}
		})
	}
}

// TestOpenAIEmitError stops the stream when emit fails and returns that
// error.
func TestOpenAIEmitError(t *testing.T) {
	t.Parallel()
	_, hs := startSimServer(t, llm.SimConfig{Tokens: 10, Seed: 1})
	c := newClient(t, llm.OpenAIConfig{BaseURL: hs.URL + "/v1"})
	boom := errors.New("downstream gone")
	n := 0
	_, err := c.Stream(t.Context(), userReq("hi"), func(protocol.Chunk) error {
		if n++; n == 2 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || n != 2 {
		t.Errorf("err = %v after %d emits, want the emit error after 2", err, n)
	}
}

// waitFor checks cond on a short ticker until it holds or timeout passes.
func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	testutil.Eventually(tb, timeout, cond, what)
}

func TestNewOpenAIValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   llm.OpenAIConfig
		valid bool
	}{
		{"http", llm.OpenAIConfig{BaseURL: "http://127.0.0.1:8081/v1"}, true},
		{"https with key", llm.OpenAIConfig{BaseURL: "https://api.openai.com/v1/", APIKey: "k", Timeout: time.Minute}, true},
		{"own client", llm.OpenAIConfig{BaseURL: "http://x/v1", HTTPClient: &http.Client{}}, true},
		{"empty", llm.OpenAIConfig{}, false},
		{"no scheme", llm.OpenAIConfig{BaseURL: "127.0.0.1:8081/v1"}, false},
		{"ftp", llm.OpenAIConfig{BaseURL: "ftp://x/v1"}, false},
		{"no host", llm.OpenAIConfig{BaseURL: "http:///v1"}, false},
		{"bad URL", llm.OpenAIConfig{BaseURL: "http://[::1"}, false},
		{"negative timeout", llm.OpenAIConfig{BaseURL: "http://x/v1", Timeout: -1}, false},
		{"client timeout", llm.OpenAIConfig{BaseURL: "http://x/v1", HTTPClient: &http.Client{Timeout: time.Second}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := llm.NewOpenAI(tc.cfg)
			if (err == nil) != tc.valid || (c != nil) != tc.valid {
				t.Errorf("NewOpenAI(%+v) = %v, %v; want valid=%v", tc.cfg, c, err, tc.valid)
			}
			if c != nil && c.Name() != "openai" {
				t.Errorf("Name() = %q", c.Name())
			}
		})
	}
}
