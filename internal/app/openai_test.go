package app

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// sdkClient is the official OpenAI Go SDK pointed at an api, as a user
// would configure it, with its own retries off so every refusal surfaces.
func sdkClient(url string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(url + "/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0),
	}, opts...)...)
}

// streamAnswer asks /v1/stream for msgs and returns its answer, checked
// against the simulator's.
func streamAnswer(tb testing.TB, url string, msgs []protocol.Message, want []string) string {
	tb.Helper()
	resp := postStream(tb, tb.(*testing.T).Context(), url, map[string]any{"messages": msgs}, nil)
	defer resp.Body.Close()
	rep := loadtest.StreamCheck{Want: want}.Check(resp.Body)
	if resp.StatusCode != http.StatusOK || rep.Lost || rep.Terminal != protocol.EventDone {
		tb.Fatalf("/v1/stream: HTTP %d %+v", resp.StatusCode, rep)
	}
	return strings.Join(want, "")
}

// Through the SDK, streamed and not, on the direct and the queued path:
// the answer equals /v1/stream's for the same messages; the usage chunk
// comes when asked; the headers name the path.
func TestOpenAISDKBothPaths(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path string
		env  map[string]string
	}{
		{protocol.PathDirect, nil},
		{protocol.PathQueued, map[string]string{"DIRECT_PATH_ENABLED": "false", "EMBEDDED_WORKERS": "true"}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, fastSim(), nil)
			_, url := c.api(tc.env)
			client := sdkClient(url)
			ctx := t.Context()
			for _, turn := range []struct {
				params []openai.ChatCompletionMessageParamUnion
				msgs   []protocol.Message // the same messages as /v1/stream takes them
			}{
				{[]openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about spillways")},
					userMsgs("Tell me about spillways")},
				{[]openai.ChatCompletionMessageParamUnion{
					openai.SystemMessage("Be brief."),
					openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart("naïve"), openai.TextContentPart("café ☕")}),
				}, []protocol.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "naïve\ncafé ☕"}}},
			} {
				want := streamAnswer(t, url, turn.msgs, llm.SimChunks(turn.msgs, c.seed, c.tokens))
				params := openai.ChatCompletionNewParams{Model: "sim", Messages: turn.params,
					StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}

				var resp *http.Response
				s := client.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&resp))
				var got strings.Builder
				var chunks int
				var last openai.ChatCompletionChunk
				var finish string
				for s.Next() {
					ch := s.Current()
					if chunks == 0 && (len(ch.Choices) != 1 || ch.Choices[0].Delta.Role != "assistant") {
						t.Fatalf("first chunk %s has no assistant role", ch.RawJSON())
					}
					if ch.ID == "" || ch.Object != "chat.completion.chunk" || ch.Model != "sim" {
						t.Fatalf("chunk %s", ch.RawJSON())
					}
					for _, choice := range ch.Choices {
						got.WriteString(choice.Delta.Content)
						if choice.FinishReason != "" {
							finish = choice.FinishReason
						}
					}
					chunks++
					last = ch
				}
				if err := s.Err(); err != nil {
					t.Fatalf("streaming: %v", err)
				}
				if got.String() != want {
					t.Fatalf("streamed answer\n %q\nwant (as /v1/stream)\n %q", got.String(), want)
				}
				if finish != "stop" || len(last.Choices) != 0 || last.Usage.CompletionTokens != int64(c.tokens) || last.Usage.TotalTokens == 0 {
					t.Fatalf("finish %q, last chunk %s: want a usage chunk", finish, last.RawJSON())
				}
				if resp == nil || resp.Header.Get("X-Stream-Path") != tc.path || last.ID != "chatcmpl-"+resp.Header.Get("X-Request-ID") {
					t.Fatalf("response %v, last id %s", resp, last.ID)
				}

				params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
				resp = nil
				comp, err := client.Chat.Completions.New(ctx, params, option.WithResponseInto(&resp))
				if err != nil {
					t.Fatalf("not streamed: %v", err)
				}
				if len(comp.Choices) != 1 || comp.Choices[0].Message.Content != want || comp.Choices[0].FinishReason != "stop" ||
					comp.Object != "chat.completion" || comp.Usage.CompletionTokens != int64(c.tokens) {
					t.Fatalf("completion %s\nwant content %q", comp.RawJSON(), want)
				}
				if resp.Header.Get("X-Stream-Path") != tc.path || comp.ID != "chatcmpl-"+resp.Header.Get("X-Request-ID") {
					t.Fatalf("headers %v id %s", resp.Header, comp.ID)
				}
			}
		})
	}
}

// apiError asserts err is the SDK's API error with status.
func apiError(tb testing.TB, err error, status int) *openai.Error {
	tb.Helper()
	var e *openai.Error
	if !errors.As(err, &e) || e.StatusCode != status {
		tb.Fatalf("error %v, want the SDK's API error with status %d", err, status)
	}
	if e.Message == "" || e.Type == "" || e.Code == "" {
		tb.Fatalf("error body %s, want message, type and code", e.RawJSON())
	}
	return e
}

// Refusals reach the SDK as its API errors with the problem's status and
// Retry-After: a rate limit is a 429, a backlog over the threshold a 503,
// a bad request a 400.
func TestOpenAISDKRefusals(t *testing.T) {
	t.Parallel()
	hi := openai.ChatCompletionNewParams{Model: "sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}

	t.Run("rate limit", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, fastSim(), map[string]string{"RATE_LIMIT_RPS": "0.5", "RATE_LIMIT_BURST": "2"})
		_, url := c.api(nil)
		alice := sdkClient(url, option.WithHeader("X-User-ID", "alice"))
		for i := range 2 {
			if _, err := alice.Chat.Completions.New(t.Context(), hi); err != nil {
				t.Fatalf("burst request %d: %v", i, err)
			}
		}
		_, err := alice.Chat.Completions.New(t.Context(), hi)
		e := apiError(t, err, http.StatusTooManyRequests)
		ra, _ := strconv.Atoi(e.Response.Header.Get("Retry-After"))
		if e.Type != "rate_limit_error" || e.Code != "rate_limit_exceeded" || ra < 1 || ra > 2 {
			t.Fatalf("error %s Retry-After %d", e.RawJSON(), ra)
		}
		s := alice.Chat.Completions.NewStreaming(t.Context(), hi)
		if s.Next() {
			t.Fatal("a refused stream yielded a chunk")
		}
		apiError(t, s.Err(), http.StatusTooManyRequests)
		bob := sdkClient(url, option.WithHeader("X-User-ID", "bob"))
		if _, err := bob.Chat.Completions.New(t.Context(), hi); err != nil {
			t.Fatalf("bob limited by alice's use: %v", err)
		}
	})

	t.Run("queue over threshold", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, fastSim(), map[string]string{
			"QUEUE_OVERFLOW_THRESHOLD": "2", "QUEUE_OVERFLOW_HYSTERESIS": "1", "QUEUE_DEPTH_CACHE_TTL_MS": "20",
			"QUEUE_RETRY_AFTER_SECONDS": "7",
		})
		_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// No worker runs: fill the queue until the gate, reading a cached
		// depth, refuses.
		testutil.Eventually(t, 5*time.Second, func() bool {
			resp := postStream(t, ctx, url, prompt("wait"), nil)
			if resp.StatusCode == http.StatusOK {
				t.Cleanup(func() { resp.Body.Close() })
				return false
			}
			resp.Body.Close()
			return true
		}, "overflow refusal on /v1/stream")
		client := sdkClient(url)
		_, err := client.Chat.Completions.New(t.Context(), hi)
		e := apiError(t, err, http.StatusServiceUnavailable)
		ra, _ := strconv.Atoi(e.Response.Header.Get("Retry-After"))
		if e.Type != "server_error" || e.Code != "queue_overflow" || ra < 1 || ra > 7 {
			t.Fatalf("error %s Retry-After %d", e.RawJSON(), ra)
		}
	})

	t.Run("bad request and models", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, fastSim(), nil)
		_, url := c.api(nil)
		client := sdkClient(url)
		for _, p := range []openai.ChatCompletionNewParams{
			{Model: "sim", Messages: []openai.ChatCompletionMessageParamUnion{}},
			{Model: "sim", Messages: hi.Messages, MaxTokens: openai.Int(1 << 30)},
			{Model: "sim", Messages: hi.Messages, N: openai.Int(9)},
		} {
			_, err := client.Chat.Completions.New(t.Context(), p)
			if e := apiError(t, err, http.StatusBadRequest); e.Type != "invalid_request_error" || e.Code != "invalid_request" {
				t.Fatalf("error %s", e.RawJSON())
			}
		}
		// With an upstream the api lists the upstream's own models.
		page, err := client.Models.List(t.Context())
		if err != nil || len(page.Data) != 1 || page.Data[0].ID != simserver.ModelID {
			t.Fatalf("models with an upstream: %+v, %v", page, err)
		}
	})

	t.Run("models of the simulator", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, fastSim(), nil)
		_, url := c.api(map[string]string{"LLM_PROVIDER": "sim"})
		client := sdkClient(url)
		page, err := client.Models.List(t.Context())
		if err != nil || len(page.Data) != 1 || page.Data[0].ID != "sim" || page.Data[0].OwnedBy != "spillway" || page.Data[0].Created == 0 {
			t.Fatalf("models: %+v, %v", page, err)
		}
	})
}
