package llm_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// A whole-answer call (POST /v1/embeddings, /v1/completions) posts the
// body as sent to the route's endpoint and emits the upstream's JSON
// object as one raw chunk, on one line; an upstream failure keeps its
// status and whether a retry may succeed.
func TestOpenAIWholeAnswer(t *testing.T) {
	t.Parallel()
	answers := map[string]struct {
		status int
		body   string
	}{
		`"ok"`:     {200, "{\n  \"object\": \"list\",\n  \"data\": [],\n  \"usage\": {\"prompt_tokens\": 3, \"total_tokens\": 3}\n}\n"},
		`"array"`:  {200, `[1,2]`},
		`"reject"`: {400, `{"error":{"message":"bad input"}}`},
		`"busy"`:   {503, `{"error":{"message":"overloaded"}}`},
		`"huge"`:   {200, `{"x":"` + strings.Repeat("a", llm.MaxWholeAnswerBytes) + `"}`},
	}
	var gotPath, gotBody string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotPath, gotBody = r.URL.Path, string(b)
		a := answers[string(protocol.MemberValue(b, "input"))]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(up.Close)
	c := newClient(t, llm.OpenAIConfig{BaseURL: up.URL + "/v1", Model: "m"})
	call := func(input string) ([]protocol.Chunk, llm.Result, error) {
		body := `{"model":"e", "input":` + input + `}`
		req, err := protocol.DecodeEmbeddings([]byte(body), protocol.DefaultLimits)
		if err != nil {
			t.Fatal(err)
		}
		var chunks []protocol.Chunk
		res, err := c.Stream(context.Background(), req, func(ch protocol.Chunk) error {
			ch.Raw = append([]byte(nil), ch.Raw...)
			chunks = append(chunks, ch)
			return nil
		})
		if gotPath != "/v1/embeddings" || gotBody != body {
			t.Errorf("%s: upstream got %s %s, want /v1/embeddings %s", input, gotPath, gotBody, body)
		}
		return chunks, res, err
	}
	chunks, res, err := call(`"ok"`)
	if err != nil || len(chunks) != 1 || !chunks[0].Extra ||
		string(chunks[0].Raw) != `{"object":"list","data":[],"usage":{"prompt_tokens":3,"total_tokens":3}}` ||
		res.Usage.PromptTokens != 3 || res.FinishReason != "stop" {
		t.Errorf("ok: chunks %+v, result %+v, err %v", chunks, res, err)
	}
	var e *llm.Error
	for input, want := range map[string]struct {
		status    int
		retryable bool
		body      bool
	}{`"array"`: {200, false, false}, `"reject"`: {400, false, true}, `"busy"`: {503, true, false}, `"huge"`: {200, false, false}} {
		chunks, _, err := call(input)
		if len(chunks) != 0 || !errors.As(err, &e) || e.Status != want.status || e.Retryable != want.retryable ||
			(len(e.Body) > 0) != want.body {
			t.Errorf("%s: chunks %d, error %v, want status %d retryable %v", input, len(chunks), err, want.status, want.retryable)
		}
	}
}
