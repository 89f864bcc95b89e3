package llm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

const (
	// maxSSELine bounds one line, and one event's data, of an upstream
	// stream; a longer one is a permanent error rather than unbounded memory.
	maxSSELine = 1 << 20
	// maxErrorBody bounds how much of an upstream error body is kept for
	// logs.
	maxErrorBody = 512
)

// errUpstreamTimeout is the cause of an OpenAI call cut by
// OpenAIConfig.Timeout, as opposed to the caller's own context.
var errUpstreamTimeout = errors.New("llm: openai: call exceeded its timeout")

// OpenAIConfig configures a client of an OpenAI-compatible chat completions
// endpoint: OpenAI, vLLM, Ollama, llama.cpp server or simllm.
type OpenAIConfig struct {
	// BaseURL is the API root including its version segment, such as
	// http://127.0.0.1:8081/v1 (LLM_BASE_URL, required). A trailing slash is
	// ignored.
	BaseURL string
	// APIKey is sent as a bearer token when not empty (LLM_API_KEY).
	APIKey string
	// Model is sent when a request names no model. Default empty: the
	// request's model is sent as it is.
	Model string
	// Timeout bounds one whole call, from sending the request to the last
	// chunk (LLM_TIMEOUT_SECONDS, 120s in the service config). Zero means no
	// bound beyond the caller's context. A call cut by it fails retryable.
	Timeout time.Duration
	// HTTPClient sends the requests. Nil means a client shared by the
	// package whose transport keeps up to 1024 idle connections per host, so
	// many concurrent streams to one upstream reuse connections. Its
	// Client.Timeout must be zero: it would cut long streams.
	HTTPClient *http.Client
}

// Validate reports the first invalid field of c.
func (c OpenAIConfig) Validate() error {
	u, err := url.Parse(c.BaseURL)
	switch {
	case c.BaseURL == "":
		return errors.New("llm: openai: BaseURL is required")
	case err != nil:
		return fmt.Errorf("llm: openai: BaseURL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("llm: openai: BaseURL %q: scheme must be http or https", c.BaseURL)
	case u.Host == "":
		return fmt.Errorf("llm: openai: BaseURL %q has no host", c.BaseURL)
	case c.Timeout < 0:
		return fmt.Errorf("llm: openai: Timeout %s is negative", c.Timeout)
	case c.HTTPClient != nil && c.HTTPClient.Timeout != 0:
		return errors.New("llm: openai: HTTPClient.Timeout must be zero; use Timeout")
	}
	return nil
}

// OpenAI streams answers from an OpenAI-compatible /chat/completions
// endpoint. It is safe for concurrent use.
type OpenAI struct {
	endpoint string
	apiKey   string
	model    string
	timeout  time.Duration
	client   *http.Client
}

var _ Provider = (*OpenAI)(nil)

// NewOpenAI returns a client configured by cfg, or the error of
// cfg.Validate.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client := cfg.HTTPClient
	if client == nil {
		client = sharedClient()
	}
	return &OpenAI{
		endpoint: strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions",
		apiKey:   cfg.APIKey,
		model:    cfg.Model,
		timeout:  cfg.Timeout,
		client:   client,
	}, nil
}

// sharedClient is the client of every OpenAI built without an HTTPClient,
// so that they share one connection pool.
var sharedClient = sync.OnceValue(func() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024, // the default 2 would redial for nearly every stream
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Transparent gzip would buffer the stream; tokens must pass at once.
		DisableCompression: true,
	}}
})

// Name returns "openai".
func (o *OpenAI) Name() string { return "openai" }

type openAIRequest struct {
	Model         string             `json:"model"`
	Messages      []protocol.Message `json:"messages"`
	MaxTokens     int                `json:"max_tokens,omitempty"`
	Temperature   *float64           `json:"temperature,omitempty"`
	Stream        bool               `json:"stream"`
	StreamOptions openAIStreamOpts   `json:"stream_options"`
}

type openAIStreamOpts struct {
	IncludeUsage bool `json:"include_usage"`
}

type openAIChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *protocol.Usage  `json:"usage"`
	Error *json.RawMessage `json:"error"`
}

// Stream posts req with "stream": true and emits each non-empty
// choices[0].delta.content of the answer's server-sent events until
// `data: [DONE]`.
//
// Failures are *Error: HTTP 429 and 5xx are retryable and carry
// Retry-After; other statuses and malformed streams are permanent;
// connection failures, a stream that ends before [DONE] (or a finish
// reason) and OpenAIConfig.Timeout are retryable. When ctx ends, Stream
// closes the connection and returns an error wrapping ctx.Err().
// Upstream body text appears, truncated, only in error text meant for logs.
func (o *OpenAI) Stream(ctx context.Context, req protocol.ChatRequest, emit func(content string) error) (Result, error) {
	model := req.Model
	if model == "" {
		model = o.model
	}
	body, err := json.Marshal(openAIRequest{
		Model:         model,
		Messages:      req.Messages,
		MaxTokens:     req.MaxTokens,
		Temperature:   req.Temperature,
		Stream:        true,
		StreamOptions: openAIStreamOpts{IncludeUsage: true},
	})
	if err != nil {
		return Result{}, &Error{Err: fmt.Errorf("openai: encode request: %w", err)}
	}
	callCtx := ctx
	if o.timeout > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeoutCause(ctx, o.timeout, errUpstreamTimeout)
		defer cancel()
	}
	hreq, err := http.NewRequestWithContext(callCtx, http.MethodPost, o.endpoint, bytes.NewReader(body))
	if err != nil {
		return Result{}, &Error{Err: fmt.Errorf("openai: build request: %w", err)}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if o.apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+o.apiKey)
	}
	resp, err := o.client.Do(hreq)
	if err != nil {
		return Result{}, transportError(ctx, callCtx, "send request", err)
	}
	// Closing an unread body drops the connection, which is what a
	// cancelled or failed stream needs: the upstream stops generating.
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Result{}, statusError(resp, time.Now())
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return Result{}, &Error{Status: resp.StatusCode,
			Err: fmt.Errorf("openai: response content type %q is not text/event-stream", resp.Header.Get("Content-Type"))}
	}
	return readOpenAIStream(ctx, callCtx, resp.Body, emit)
}

// transportError classifies a failure to send or read: the caller's
// context first, then the call timeout, else a retryable network error.
func transportError(ctx, callCtx context.Context, doing string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("openai: %s: %w", doing, ctx.Err())
	}
	if callCtx.Err() != nil {
		return &Error{Retryable: true, Err: fmt.Errorf("openai: %s: %w", doing, context.Cause(callCtx))}
	}
	return &Error{Retryable: true, Err: fmt.Errorf("openai: %s: %w", doing, err)}
}

func statusError(resp *http.Response, now time.Time) error {
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody+1))
	e := &Error{
		Status: resp.StatusCode,
		Err:    fmt.Errorf("openai: upstream status %s: %s", resp.Status, logText(snippet)),
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		e.Retryable = true
		e.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), now)
	}
	return e
}

// parseRetryAfter reads a Retry-After value, delay-seconds or an HTTP-date,
// relative to now. Anything else, or a date in the past, gives 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// logText makes upstream bytes short and quoted for an error message.
func logText(b []byte) string {
	cut := len(b) > maxErrorBody
	if cut {
		b = b[:maxErrorBody]
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if cut {
		s += "…"
	}
	return strconv.Quote(s)
}

// readOpenAIStream parses server-sent events from body (WHATWG rules: data
// lines joined by LF, an event dispatched at a blank line, comments and
// other fields ignored) and handles each as a chat.completion.chunk.
func readOpenAIStream(ctx, callCtx context.Context, body io.Reader, emit func(string) error) (Result, error) {
	br := bufio.NewReaderSize(body, 32<<10)
	var (
		line, data   []byte
		hasData      bool
		finish       string
		usage        *protocol.Usage
		emitted      int
		lineComplete bool
	)
	result := func() Result {
		r := Result{FinishReason: finish}
		if r.FinishReason == "" {
			r.FinishReason = "stop"
		}
		if usage != nil {
			r.Usage = *usage
			if r.Usage.TotalTokens == 0 {
				r.Usage.TotalTokens = r.Usage.PromptTokens + r.Usage.CompletionTokens
			}
		} else {
			r.Usage = protocol.Usage{CompletionTokens: emitted, TotalTokens: emitted}
		}
		return r
	}
	// dispatch handles one event; done reports [DONE].
	dispatch := func(d []byte) (done bool, err error) {
		if string(d) == "[DONE]" {
			return true, nil
		}
		var c openAIChunk
		if err := json.Unmarshal(d, &c); err != nil {
			return false, &Error{Err: fmt.Errorf("openai: malformed stream event: %w", err)}
		}
		if c.Error != nil {
			// An error event mid-stream is, as far as OpenAI documents it,
			// an overload or server fault.
			return false, &Error{Retryable: true, Err: fmt.Errorf("openai: upstream error event: %s", logText(*c.Error))}
		}
		if len(c.Choices) > 0 {
			ch := c.Choices[0]
			if ch.Delta.Content != "" {
				if err := emit(ch.Delta.Content); err != nil {
					return false, fmt.Errorf("openai: emit chunk %d: %w", emitted+1, err)
				}
				emitted++
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		return false, nil
	}
	for {
		if callCtx.Err() != nil {
			return Result{}, transportError(ctx, callCtx, "read stream", callCtx.Err())
		}
		var err error
		line, lineComplete, err = readLine(br, line[:0])
		if errors.Is(err, errLineTooLong) {
			return Result{}, &Error{Err: fmt.Errorf("openai: %w", err)}
		}
		if len(line) > 0 || lineComplete {
			switch {
			case len(line) == 0: // blank line: dispatch
				if hasData {
					done, derr := dispatch(data)
					if derr != nil || done {
						return result(), derr
					}
				}
				data, hasData = data[:0], false
			case line[0] == ':': // comment
			default:
				name, value, _ := bytes.Cut(line, []byte(":"))
				value = bytes.TrimPrefix(value, []byte(" "))
				if string(name) == "data" {
					if hasData {
						data = append(data, '\n')
					}
					if len(data)+len(value) > maxSSELine {
						return Result{}, &Error{Err: fmt.Errorf("openai: stream event exceeds %d bytes", maxSSELine)}
					}
					data, hasData = append(data, value...), true
				}
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			// Tolerate a server that ends without a final blank line or
			// without [DONE] once the answer has said it is finished.
			if hasData {
				done, derr := dispatch(data)
				if derr != nil || done {
					return result(), derr
				}
			}
			if finish != "" {
				return result(), nil
			}
			return Result{}, &Error{Retryable: true,
				Err: fmt.Errorf("openai: stream ended after %d chunks without [DONE]: %w", emitted, io.ErrUnexpectedEOF)}
		default:
			return Result{}, transportError(ctx, callCtx, "read stream", err)
		}
	}
}

var errLineTooLong = fmt.Errorf("stream line exceeds %d bytes", maxSSELine)

// readLine appends to buf one line of br without its line ending (LF or
// CRLF). complete reports that a line ending was read; at the end of input
// a last unterminated line comes with io.EOF.
func readLine(br *bufio.Reader, buf []byte) (line []byte, complete bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > maxSSELine+2 {
			return buf, false, errLineTooLong
		}
		buf = append(buf, frag...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return buf, false, err
		}
		buf = buf[:len(buf)-1]
		if n := len(buf); n > 0 && buf[n-1] == '\r' {
			buf = buf[:n-1]
		}
		return buf, true, nil
	}
}
