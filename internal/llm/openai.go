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
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/redact"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

const (
	// maxSSELine bounds one line, and one event's data, of an upstream
	// stream; a longer one is a permanent error rather than unbounded memory.
	maxSSELine = 1 << 20
	// maxErrorBody bounds how much of an upstream error body is kept for
	// logs.
	maxErrorBody = 512
	// maxClientErrorBody bounds an upstream's refusal of a request
	// (IsClientError) kept to be passed on to the client as it was sent.
	maxClientErrorBody = 64 << 10
)

// Defaults of OpenAIConfig's timeouts (docs/TIMEOUTS.md).
const (
	DefaultFirstTokenTimeout = 60 * time.Second
	DefaultIdleTimeout       = 30 * time.Second
)

// Causes of a call's context cut by the client itself, as opposed to the
// caller's context. Stream turns them into ErrFirstTokenTimeout,
// ErrIdleTimeout or ErrTotalTimeout depending on whether the first chunk
// had come.
var (
	errStalled  = errors.New("llm: openai: watchdog fired")
	errCallTime = errors.New("llm: openai: call timeout")
)

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
	// FirstTokenTimeout bounds the wait from sending the request to the
	// first chunk: the first event that carries model output (content,
	// reasoning, tool calls or a finish reason; a role-only preamble does
	// not count, as some servers send it before the model has run). SSE
	// comments before it do not extend it: an upstream that keeps a request
	// waiting in its own queue while sending keepalives is as slow to start
	// as a silent one (LLM_FIRST_TOKEN_TIMEOUT_SECONDS, default 60s; zero
	// means the default). A call cut by it fails with ErrFirstTokenTimeout.
	FirstTokenTimeout time.Duration
	// IdleTimeout bounds the silence between two reads of the stream after
	// the first chunk (LLM_IDLE_TIMEOUT_SECONDS, default 30s; zero means the
	// default). Any bytes reset it, SSE comments and keepalives too: they
	// prove the upstream and the connection alive, and reasoning models
	// send events without content for minutes; a keepalive-only stream that
	// never ends is what Timeout is for. Time the caller spends in emit is
	// not silence: the clock runs only while waiting on the upstream. A call
	// cut by it fails with ErrIdleTimeout.
	IdleTimeout time.Duration
	// Timeout optionally bounds one whole call, from sending the request
	// to the last chunk (LLM_TIMEOUT_SECONDS). Default zero: no bound, so
	// an answer that keeps flowing is never cut. A call cut by it fails
	// with ErrTotalTimeout, or ErrFirstTokenTimeout before its first chunk.
	// The service config keeps it 0 or at least FirstTokenTimeout.
	Timeout time.Duration
	// HTTPClient sends the requests. Nil means a client shared by the
	// package whose transport keeps up to 1024 idle connections per host, so
	// many concurrent streams to one upstream reuse connections. Its
	// Client.Timeout must be zero: it would cut long streams.
	HTTPClient *http.Client
	// Tracing, when on, gives each call a "chat {model}" client span with
	// the GenAI attributes, and sends the W3C traceparent upstream
	// (docs/TRACING.md). Nil or off: no span, no header, no allocation.
	Tracing *telemetry.Provider
}

// Validate reports FirstTokenTimeout and IdleTimeout out of range as
// *bounds.Errors, checked as given (NewOpenAI fills a zero one with its
// default first), else the first other invalid field of c.
func (c OpenAIConfig) Validate() error {
	if err := errors.Join(
		bounds.AtLeast("FirstTokenTimeout", c.FirstTokenTimeout, 1),
		bounds.AtLeast("IdleTimeout", c.IdleTimeout, 1),
	); err != nil {
		return fmt.Errorf("llm: openai: %w", err)
	}
	u, err := url.Parse(c.BaseURL)
	switch {
	case c.BaseURL == "":
		return errors.New("llm: openai: BaseURL is required")
	case err != nil:
		// Not the *url.Error: it repeats the URL, password and all.
		return errors.New("llm: openai: BaseURL is not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("llm: openai: BaseURL %q: scheme must be http or https", redact.URL(c.BaseURL))
	case u.Host == "":
		return fmt.Errorf("llm: openai: BaseURL %q has no host", redact.URL(c.BaseURL))
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
	endpoint   string
	responses  string // the Responses API's endpoint
	base       string // BaseURL without its trailing slash: whole-answer routes' endpoints are under it
	apiKey     string
	model      string
	firstToken time.Duration
	idle       time.Duration
	timeout    time.Duration
	client     *http.Client
	tracing    *telemetry.Provider
}

var _ Provider = (*OpenAI)(nil)

// NewOpenAI returns a client configured by cfg, or the error of
// cfg.Validate.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if cfg.FirstTokenTimeout == 0 {
		cfg.FirstTokenTimeout = DefaultFirstTokenTimeout
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client := cfg.HTTPClient
	if client == nil {
		client = sharedClient()
	}
	if cfg.Tracing.Enabled() {
		// A copy, so the shared client stays untraced for other users.
		traced := *client
		traced.Transport = cfg.Tracing.HTTPTransport(client.Transport)
		client = &traced
	}
	o := &OpenAI{
		tracing:    cfg.Tracing,
		endpoint:   strings.TrimRight(cfg.BaseURL, "/") + "/chat/completions",
		responses:  strings.TrimRight(cfg.BaseURL, "/") + "/responses",
		base:       strings.TrimRight(cfg.BaseURL, "/"),
		apiKey:     cfg.APIKey,
		model:      cfg.Model,
		firstToken: cfg.FirstTokenTimeout,
		idle:       cfg.IdleTimeout,
		timeout:    cfg.Timeout,
		client:     client,
	}
	return o, nil
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
		Index int `json:"index"`
		Delta struct {
			Content string `json:"content"`
			// Reasoning models (vLLM's reasoning_content, OpenRouter's and
			// Ollama's reasoning) and tool calls produce output without
			// content.
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			Refusal          json.RawMessage `json:"refusal"`
			Audio            json.RawMessage `json:"audio"`
			FunctionCall     json.RawMessage `json:"function_call"`
		} `json:"delta"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *protocol.Usage  `json:"usage"`
	Error *json.RawMessage `json:"error"`
}

// present reports a member that was sent and is not null.
func present(b json.RawMessage) bool { return len(b) > 0 && string(b) != "null" }

// Stream posts req with "stream": true and emits each chunk of the
// answer's server-sent events until `data: [DONE]`: every chunk the
// upstream sent, its JSON in Chunk.Raw as it came (on one line), with
// choices[0].delta.content in Chunk.Content. A request with a Body is
// sent as it is, with only the fields Spillway owns changed
// (protocol.ChatRequest.UpstreamBody).
//
// Failures are *Error: HTTP 429 and 5xx are retryable and carry
// Retry-After; other statuses and malformed streams are permanent;
// connection failures, a stream that ends before [DONE] (or a finish
// reason) and the timeouts (ErrFirstTokenTimeout, ErrIdleTimeout,
// ErrTotalTimeout) are retryable. When ctx ends, Stream closes the
// connection and returns an error wrapping ctx.Err(); a timeout closes it
// too, so the upstream stops generating. Upstream body text appears,
// truncated, only in error text meant for logs; an upstream's refusal of
// the request (IsClientError) keeps its whole body in Error.Body, for the
// client.
func (o *OpenAI) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (Result, error) {
	model := req.Model
	if model == "" {
		model = o.model
	}
	ctx, span := o.tracing.StartProviderCall(ctx, o.Name(), model)
	res, err := o.stream(ctx, model, req, emit, span)
	endCall(ctx, span, res, err)
	return res, err
}

// endCall records how a provider call ended on its span and ends it.
func endCall(ctx context.Context, span trace.Span, res Result, err error) {
	if !span.IsRecording() {
		return
	}
	switch {
	case err == nil:
		telemetry.SetCallResult(span, telemetry.CallResult{
			InputTokens: res.Usage.PromptTokens, OutputTokens: res.Usage.CompletionTokens, FinishReason: res.FinishReason,
		})
		telemetry.Outcome(span, "done", "")
	case ctx.Err() != nil:
		telemetry.Outcome(span, "cancelled", "")
	default:
		telemetry.Outcome(span, telemetry.OutcomeError, "")
	}
	span.End()
}

// stream is Stream for model, under span (a no-op span when untraced).
func (o *OpenAI) stream(ctx context.Context, model string, req protocol.ChatRequest, emit func(protocol.Chunk) error, span trace.Span) (Result, error) {
	body, ok := req.UpstreamBody(o.model)
	if !ok {
		var err error
		body, err = json.Marshal(openAIRequest{
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
	}
	c := &openAICall{o: o, phase: phaseFirst, ctx: ctx, callCtx: ctx, emit: emit, span: span, plainRaw: !protocol.Native(req.Route),
		responses: req.Route == protocol.RouteResponses, completions: req.Route == protocol.RouteCompletions}
	endpoint := o.endpoint
	switch {
	case c.responses:
		endpoint = o.responses
	case c.completions:
		endpoint = o.base + "/" + protocol.RouteCompletions
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		c.callCtx, cancel = context.WithTimeoutCause(c.callCtx, o.timeout, errCallTime)
		defer cancel()
	}
	// One timer per call, not a goroutine per chunk: it runs from sending
	// the request to the first chunk, then measures each wait on the body
	// (watchdog.Read), lazily (fire). Firing cancels the request's
	// context, which makes the transport close the connection and the
	// read return.
	c.callCtx, c.cancel = context.WithCancelCause(c.callCtx)
	defer c.cancel(nil)
	c.epoch = time.Now()
	c.timer = time.AfterFunc(o.firstToken, c.fire)
	defer c.stopTimer()

	if req.WholeAnswer() {
		return c.whole(o.base+"/"+req.Route, body)
	}
	hreq, err := http.NewRequestWithContext(c.callCtx, http.MethodPost, endpoint, bytes.NewReader(body))
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
		return Result{}, c.fail("send request", err)
	}
	// Closing an unread body drops the connection, which is what a
	// cancelled or failed stream needs: the upstream stops generating.
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Result{}, statusError(resp, time.Now())
	}
	c.status = resp.StatusCode
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return Result{}, &Error{Status: resp.StatusCode,
			Err: fmt.Errorf("openai: response content type %q is not text/event-stream", resp.Header.Get("Content-Type"))}
	}
	wd := &watchdog{body: resp.Body, call: c, watcher: readWatcherOf(ctx)}
	if wd.watcher != nil {
		wd.watcher.Reading(true)
	}
	res, err := c.read(wd)
	if wd.watcher != nil {
		wd.watcher.Reading(false)
	}
	if err == nil {
		c.drain(resp.Body)
	}
	return res, err
}

// After an answer's end (`data: [DONE]`, or a finish reason and the end
// of the body) only the end of the HTTP response is left, usually on its
// way already: drain reads it, at most drainBytes within drainWait, so the
// transport keeps the connection for the next call instead of closing it
// (a body closed before its end closes the connection) and dialling
// anew. An upstream that sends more, or is slow to end the response, has
// its connection closed, as before.
const (
	drainBytes = 4 << 10
	drainWait  = 20 * time.Millisecond
)

func (c *openAICall) drain(body io.Reader) {
	c.arm(phaseDrain, drainWait) // fires errStalled: the transport closes the connection
	_, _ = io.CopyN(io.Discard, body, drainBytes)
	c.timer.Stop()
}

// openAICall is the state of one Stream call.
type openAICall struct {
	o       *OpenAI
	ctx     context.Context // the caller's
	callCtx context.Context // ctx bounded by the call's timeouts
	emit    func(protocol.Chunk) error
	span    trace.Span  // the provider-call span, for its first_chunk event
	timer   *time.Timer // runs fire, which cancels callCtx with errStalled
	cancel  context.CancelCauseFunc
	// mu orders fire against the phase changes (arm) and the call's end
	// (stopTimer), which move the timer; phase and ended are under it.
	mu      sync.Mutex
	phase   timerPhase
	ended   bool
	epoch   time.Time    // the call's start, the origin of reading
	reading atomic.Int64 // when the read under way began (since epoch, +1); 0 between reads
	// started is set at the first chunk; from then on the timer measures
	// silence (IdleTimeout) instead of the wait for the first chunk.
	started bool
	emitted int // chunks passed to emit
	status  int // HTTP status of the response, once it arrived
	// fast is the fast path's reading of one event, its buffers reused;
	// slab is where the strings and raw chunks passed to emit are carved
	// from (slabString).
	fast fastEvent
	slab []byte
	// plainRaw: the client relays chunks of plain content raw too (the
	// OpenAI dialect); a /v1/stream client needs the raw chunk only with
	// extra deltas, so the others are not copied.
	plainRaw bool
	// responses: the call is the Responses API's, whose events are
	// relayed as they come (responsesEvent).
	responses bool
	// completions: the call is a streamed legacy completion, whose
	// chunks carry choices[].text (completionsEvent).
	completions bool
}

// completionsChunk is what the client reads of a streamed legacy
// completion's chunk.
type completionsChunk struct {
	Choices []struct {
		Text         string          `json:"text"`
		Index        int             `json:"index"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *protocol.Usage  `json:"usage"`
	Error *json.RawMessage `json:"error"`
}

// completionsEvent handles one chunk of a streamed legacy completion
// (POST /v1/completions with stream): relayed as it came, its first
// choice's text as content.
func (c *openAICall) completionsEvent(d []byte, finish *string, usage **protocol.Usage) error {
	var ch completionsChunk
	if err := json.Unmarshal(d, &ch); err != nil {
		return &Error{Status: c.status, Err: fmt.Errorf("openai: malformed stream event: %w", err)}
	}
	if ch.Error != nil {
		return &Error{Retryable: true, Status: c.status, Err: fmt.Errorf("openai: %w: %s", errStreamErrorEvent, logText(*ch.Error))}
	}
	var content []byte
	extra := len(ch.Choices) > 1
	for _, cc := range ch.Choices {
		if cc.Text != "" || cc.FinishReason != nil || present(cc.Logprobs) {
			c.start()
		}
		extra = extra || cc.Index != 0 || present(cc.Logprobs)
		if cc.Index == 0 {
			content = []byte(cc.Text)
			if cc.FinishReason != nil && *cc.FinishReason != "" {
				*finish = *cc.FinishReason
			}
		}
	}
	if ch.Usage != nil {
		c.start()
		*usage = ch.Usage
	}
	return c.chunk(d, content, extra)
}

// MaxWholeAnswerBytes bounds the JSON answer of a whole-answer call
// (POST /v1/embeddings, /v1/completions): it travels as one raw chunk,
// within one result-channel message on the queued path.
const MaxWholeAnswerBytes = protocol.MaxResultBytes - 64<<10 // room for the message's envelope

// whole is the call of a whole-answer route: body POSTed to endpoint as
// sent, the upstream's JSON object read whole (at most
// MaxWholeAnswerBytes) and emitted as one raw chunk, compacted to one
// line. The wait for it is the wait for a first chunk: the whole answer
// is the first.
func (c *openAICall) whole(endpoint string, body []byte) (Result, error) {
	hreq, err := http.NewRequestWithContext(c.callCtx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return Result{}, &Error{Err: fmt.Errorf("openai: build request: %w", err)}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if c.o.apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.o.apiKey)
	}
	resp, err := c.o.client.Do(hreq)
	if err != nil {
		return Result{}, c.fail("send request", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Result{}, statusError(resp, time.Now())
	}
	c.status = resp.StatusCode
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxWholeAnswerBytes+1))
	if err != nil {
		return Result{}, c.fail("read response", err)
	}
	if len(b) > MaxWholeAnswerBytes {
		return Result{}, &Error{Status: resp.StatusCode,
			Err: fmt.Errorf("openai: answer exceeds %d bytes", MaxWholeAnswerBytes)}
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' || !json.Valid(b) {
		return Result{}, &Error{Status: resp.StatusCode,
			Err: fmt.Errorf("openai: answer is not a JSON object: %s", logText(b))}
	}
	if bytes.ContainsAny(b, "\r\n") {
		var out bytes.Buffer
		if err := json.Compact(&out, b); err != nil {
			return Result{}, &Error{Status: resp.StatusCode, Err: fmt.Errorf("openai: compact answer: %w", err)}
		}
		b = out.Bytes()
	}
	c.start()
	var res Result
	var ans struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	_ = json.Unmarshal(b, &ans) // best effort: the answer goes as it came
	res.FinishReason = "stop"
	if len(ans.Choices) > 0 && ans.Choices[0].FinishReason != "" {
		res.FinishReason = ans.Choices[0].FinishReason
	}
	if u := ans.Usage; u != nil {
		res.Usage = protocol.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	}
	if err := c.emit(protocol.Chunk{Raw: b, Extra: true}); err != nil {
		return Result{}, fmt.Errorf("openai: emit answer: %w", err)
	}
	return res, nil
}

// responsesEvent is what the client reads of a Responses API event.
type responsesEvent struct {
	Type     string `json:"type"`
	Delta    string `json:"delta"`
	Response *struct {
		Status string `json:"status"`
		Usage  *struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	} `json:"response"`
}

// responsesEvent handles one event of a Responses API stream: every event
// is relayed as it came (its type names its SSE event); the text deltas
// are its content; response.completed and response.incomplete end the
// answer, response.failed and error fail it.
func (c *openAICall) responsesEvent(d []byte, finish *string, usage **protocol.Usage) error {
	var ev responsesEvent
	if err := json.Unmarshal(d, &ev); err != nil || ev.Type == "" {
		return &Error{Status: c.status, Err: fmt.Errorf("openai: malformed Responses API event: %s", logText(d))}
	}
	switch ev.Type {
	case "response.failed", "error":
		return &Error{Retryable: true, Status: c.status,
			Err: fmt.Errorf("openai: %w: %s", errStreamErrorEvent, logText(d))}
	case "response.completed", "response.incomplete":
		*finish = "stop"
		if ev.Type == "response.incomplete" {
			*finish = "length"
		}
		if ev.Response != nil && ev.Response.Usage != nil {
			u := ev.Response.Usage
			*usage = &protocol.Usage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens, TotalTokens: u.TotalTokens}
		}
	}
	// Every event past the response's creation is output: the client
	// sees it as it comes.
	output := ev.Type != "response.created" && ev.Type != "response.in_progress"
	if output {
		c.start()
	}
	content := []byte(nil)
	if ev.Type == "response.output_text.delta" {
		content = []byte(ev.Delta)
	}
	return c.chunk(d, content, output)
}

// chunk emits one chunk: its content, carved from the slab so that it
// outlives the read buffer, and its raw JSON, which does not.
func (c *openAICall) chunk(d, content []byte, extra bool) error {
	ch := protocol.Chunk{Content: slabString(&c.slab, content), Extra: extra}
	if extra || c.plainRaw {
		if bytes.IndexByte(d, '\n') >= 0 || bytes.IndexByte(d, '\r') >= 0 {
			// Data lines joined by line breaks: JSON white space that an
			// SSE data line cannot carry on.
			var buf bytes.Buffer
			if err := json.Compact(&buf, d); err == nil {
				d = buf.Bytes()
			}
		}
		// The event's own bytes, valid until emit returns (Provider):
		// the caller copies what it keeps, into storage it reuses.
		ch.Raw = d
	}
	if err := c.emit(ch); err != nil {
		return fmt.Errorf("openai: emit chunk %d: %w", c.emitted+1, err)
	}
	if len(content) > 0 {
		c.emitted++
	}
	return nil
}

// timerPhase is what the call's timer measures.
type timerPhase uint8

const (
	// phaseFirst: the wait for the first chunk; firing stalls the call.
	phaseFirst timerPhase = iota
	// phaseIdle: each read of the body, which stalls the call once it has
	// waited IdleTimeout (fire).
	phaseIdle
	// phaseDrain: the drain of the response's end; firing drops the
	// connection.
	phaseDrain
)

// start ends the first-token phase: from now on the timer measures each
// read of the body (watchdog), so the time emit takes does not count as
// upstream silence.
func (c *openAICall) start() {
	if !c.started {
		c.started = true
		c.arm(phaseIdle, c.o.idle)
		telemetry.FirstChunk(c.span)
	}
}

// arm enters phase with the timer firing after d.
func (c *openAICall) arm(phase timerPhase, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.phase = phase
	c.timer.Reset(d)
}

// stopTimer stops the timer for good when the call ends: fire re-arms it
// no more.
func (c *openAICall) stopTimer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	c.timer.Stop()
}

// since is the time since the call's start, plus one: never 0.
func (c *openAICall) since() int64 { return int64(time.Since(c.epoch)) + 1 }

// fire runs when the timer does. In the idle phase the timer is not moved
// at every read (two timer updates per chunk of a paced answer): a read
// that has waited IdleTimeout stalls the call, one that began later has
// the timer fire again when it will have, and between reads (emit
// running) it fires again after IdleTimeout. Else it stalls the call.
func (c *openAICall) fire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	if c.phase == phaseIdle {
		began := c.reading.Load()
		if began == 0 {
			c.timer.Reset(c.o.idle)
			return
		}
		if waited := time.Duration(c.since() - began); waited < c.o.idle {
			c.timer.Reset(c.o.idle - waited)
			return
		}
	}
	c.cancel(errStalled)
}

// watchdog marks each read of the body after the first chunk for the
// call's timer (fire): any bytes, SSE comments included, end the silence.
// Before each read it tells the caller's ReadWatcher, if any, which then
// sends what it gathered of the chunks emitted so far.
type watchdog struct {
	body    io.Reader
	call    *openAICall
	watcher ReadWatcher
}

func (w *watchdog) Read(p []byte) (int, error) {
	c := w.call
	if w.watcher != nil {
		w.watcher.BeforeRead()
	}
	if c.started {
		c.reading.Store(c.since())
	}
	n, err := w.body.Read(p)
	if c.started {
		c.reading.Store(0)
	}
	return n, err
}

// fail classifies a failure to send or read: the caller's context first,
// then the call's own timeouts, else a retryable network error.
func (c *openAICall) fail(doing string, err error) error {
	if c.ctx.Err() != nil {
		return fmt.Errorf("openai: %s: %w", doing, c.ctx.Err())
	}
	e := &Error{Retryable: true, Status: c.status}
	if c.callCtx.Err() == nil {
		e.Err = fmt.Errorf("openai: %s: %w", doing, err)
		return e
	}
	cause := context.Cause(c.callCtx)
	switch {
	case !c.started && errors.Is(cause, errCallTime):
		e.Err = fmt.Errorf("openai: %s: no chunk within the call timeout %s: %w: %w",
			doing, c.o.timeout, ErrFirstTokenTimeout, ErrTotalTimeout)
	case !c.started:
		e.Err = fmt.Errorf("openai: %s: no chunk within %s: %w", doing, c.o.firstToken, ErrFirstTokenTimeout)
	case errors.Is(cause, errCallTime):
		e.Err = fmt.Errorf("openai: %s: cut after %s and %d chunks: %w", doing, c.o.timeout, c.emitted, ErrTotalTimeout)
	default:
		e.Err = fmt.Errorf("openai: %s: upstream silent for %s after %d chunks: %w", doing, c.o.idle, c.emitted, ErrIdleTimeout)
	}
	return e
}

func statusError(resp *http.Response, now time.Time) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxClientErrorBody))
	e := &Error{
		Status: resp.StatusCode,
		Err:    fmt.Errorf("openai: upstream status %s: %s", resp.Status, logText(body)),
	}
	if IsClientError(e) {
		e.Body = body
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

// streamReaders are the read buffers of answers being read (32 KiB each,
// reused: one per call would be a large allocation per stream).
var streamReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 32<<10) }}

// read parses server-sent events from body (WHATWG rules: data lines
// joined by LF, an event dispatched at a blank line, comments and other
// fields ignored) and handles each as a chat.completion.chunk.
func (c *openAICall) read(body io.Reader) (Result, error) {
	br := streamReaders.Get().(*bufio.Reader)
	br.Reset(body)
	defer func() {
		br.Reset(nil)
		streamReaders.Put(br)
	}()
	var (
		line, data   []byte
		hasData      bool
		finish       string
		usage        *protocol.Usage
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
			r.Usage = protocol.Usage{CompletionTokens: c.emitted, TotalTokens: c.emitted}
		}
		return r
	}
	// dispatch handles one event; done reports [DONE].
	dispatch := func(d []byte) (done bool, err error) {
		if string(d) == "[DONE]" {
			return true, nil
		}
		if c.responses {
			return false, c.responsesEvent(d, &finish, &usage)
		}
		if c.completions {
			return false, c.completionsEvent(d, &finish, &usage)
		}
		// The common shapes are read without a full decode
		// (fastchunk.go), to the same effect as the full decode below;
		// the rest is decoded in full.
		if ev := &c.fast; fastChunk(d, ev) {
			if len(ev.content) > 0 || ev.hasFinish || ev.hasUsage || ev.extra {
				c.start()
			}
			if err := c.chunk(d, ev.content, ev.extra); err != nil {
				return false, err
			}
			switch string(ev.finish) {
			case "":
			case "stop": // the usual ones, without a string each
				finish = "stop"
			case "length":
				finish = "length"
			default:
				finish = string(ev.finish)
			}
			if ev.hasUsage {
				u := ev.usage
				usage = &u
			}
			return false, nil
		}
		var ch openAIChunk
		if err := json.Unmarshal(d, &ch); err != nil {
			return false, &Error{Status: c.status, Err: fmt.Errorf("openai: malformed stream event: %w", err)}
		}
		if ch.Error != nil {
			return false, &Error{Retryable: true, Status: c.status,
				Err: fmt.Errorf("openai: %w: %s", errStreamErrorEvent, logText(*ch.Error))}
		}
		var content string
		extra := len(ch.Choices) > 1
		for _, cc := range ch.Choices {
			shows := cc.Delta.ReasoningContent != "" || cc.Delta.Reasoning != "" || present(cc.Delta.ToolCalls) ||
				present(cc.Delta.Refusal) || present(cc.Delta.Audio) || present(cc.Delta.FunctionCall) || present(cc.Logprobs)
			if cc.Delta.Content != "" || shows || cc.FinishReason != nil {
				c.start()
			}
			extra = extra || shows || cc.Index != 0
			if cc.Index == 0 {
				content = cc.Delta.Content
				if cc.FinishReason != nil && *cc.FinishReason != "" {
					finish = *cc.FinishReason
				}
			}
		}
		if err := c.chunk(d, []byte(content), extra); err != nil {
			return false, err
		}
		if ch.Usage != nil {
			c.start()
			usage = ch.Usage
		}
		return false, nil
	}
	for {
		if c.callCtx.Err() != nil {
			return Result{}, c.fail("read stream", c.callCtx.Err())
		}
		var err error
		line, lineComplete, err = readLine(br, line[:0])
		if errors.Is(err, errLineTooLong) {
			return Result{}, &Error{Status: c.status, Err: fmt.Errorf("openai: %w", err)}
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
						return Result{}, &Error{Status: c.status, Err: fmt.Errorf("openai: stream event exceeds %d bytes", maxSSELine)}
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
			if c.callCtx.Err() != nil { // a transport may report the cut as EOF
				return Result{}, c.fail("read stream", io.ErrUnexpectedEOF)
			}
			return Result{}, &Error{Retryable: true, Status: c.status,
				Err: fmt.Errorf("openai: stream ended after %d chunks without [DONE]: %w", c.emitted, io.ErrUnexpectedEOF)}
		default:
			return Result{}, c.fail("read stream", err)
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
