package openaiwire

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// The chunk encoder's wire strings, byte for byte.
func TestChunkEncoderGolden(t *testing.T) {
	t.Parallel()
	e := NewChunkEncoder("r-1", "sim", 1700000000)
	head := `data: {"id":"chatcmpl-r-1","object":"chat.completion.chunk","created":1700000000,"model":"sim",`
	tests := []struct {
		name string
		got  []byte
		want string
	}{
		{"first", e.AppendContent(nil, "Hello", true),
			head + `"choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}` + "\n\n"},
		{"next escapes line breaks", e.AppendContent(nil, " wor\nld\r\x00\"", false),
			head + `"choices":[{"index":0,"delta":{"content":" wor\nld\r\u0000\""},"finish_reason":null}]}` + "\n\n"},
		{"finish", e.AppendFinish(nil, "length"),
			head + `"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n"},
		{"usage", e.AppendUsage(nil, protocol.Usage{PromptTokens: 3, CompletionTokens: 5, TotalTokens: 8}),
			head + `"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}` + "\n\n"},
		{"error", AppendErrorEvent(nil, protocol.WorkerLost(1)),
			`data: {"error":{"message":"The worker answering the request stopped and no other took over; retry the request.","type":"server_error","code":"worker_lost"}}` + "\n\n"},
		{"done", DoneFrame, "data: [DONE]\n\n"},
	}
	for _, tt := range tests {
		if string(tt.got) != tt.want {
			t.Errorf("%s:\n got %q\nwant %q", tt.name, tt.got, tt.want)
		}
	}
}

// Every chunk is one `data:` line of valid JSON whatever the content and
// model, so no content can start another SSE field.
func TestChunkIsOneDataLine(t *testing.T) {
	t.Parallel()
	e := NewChunkEncoder("id\n:x", "m\r\nevent: done", 1)
	for _, content := range []string{"", "a\nb", "\r\n\r\n", "data: [DONE]\n\n", "\u2028<>&"} {
		b := e.AppendContent(nil, content, true)
		line, rest, _ := strings.Cut(string(b), "\n")
		if rest != "\n" || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("content %q: frame %q is not one data line", content, b)
		}
		var c struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &c); err != nil {
			t.Fatalf("content %q: %v", content, err)
		}
		if c.ID != "chatcmpl-id\n:x" || c.Model != "m\r\nevent: done" || c.Choices[0].Delta.Content != content {
			t.Fatalf("round trip %+v", c)
		}
	}
}

// Every catalogued problem maps to an error whose type follows its status
// and whose code is set; OpenAI's own codes where it has them.
func TestErrorOfEveryProblem(t *testing.T) {
	t.Parallel()
	for slug, pt := range protocol.Problems {
		e := ErrorOf(pt.New("detail for " + slug))
		if e.Message != "detail for "+slug || e.Code == "" || strings.Contains(e.Code, "-") {
			t.Errorf("%s: %+v", slug, e)
		}
		var want string
		switch {
		case pt.Status == 401:
			want = TypeAuthentication
		case pt.Status == 429:
			want = TypeRateLimit
		case pt.Status < 500:
			want = TypeInvalidRequest
		default:
			want = TypeServer
		}
		if e.Type != want {
			t.Errorf("%s (status %d): type %s, want %s", slug, pt.Status, e.Type, want)
		}
	}
	for p, code := range map[*protocol.Problem]string{
		protocol.RateLimited(2):                             "rate_limit_exceeded",
		protocol.Unauthorized("x"):                          "invalid_api_key",
		protocol.QueueOverflow(3):                           "queue_overflow",
		protocol.PoolExhausted(1):                           "pool_exhausted",
		protocol.BadRequest("x"):                            "invalid_request",
		protocol.ProviderFailed(0):                          "provider_error",
		protocol.Problems[protocol.ProblemInternal].New(""): "internal",
	} {
		if got := ErrorOf(p).Code; got != code {
			t.Errorf("%s: code %s, want %s", p.Slug(), got, code)
		}
	}
	if e := ErrorOf(protocol.Problems[protocol.ProblemInternal].New("")); e.Message != "Internal Error" {
		t.Errorf("an empty detail falls back to the title, got %q", e.Message)
	}
}
