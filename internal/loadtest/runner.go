package loadtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Config describes one load run. The defaults named below are those of
// cmd/loadtest's flags; Validate accepts any consistent values.
type Config struct {
	// URL is the stream endpoint (default http://127.0.0.1:8080/v1/stream).
	URL string
	// Concurrency is the number of clients streaming at once (default 10).
	Concurrency int
	// Requests bounds the number of requests; 0 means no bound but
	// Duration (default 100).
	Requests int
	// Duration stops starting new requests after this long; 0 means no
	// bound but Requests. Streams already running still finish, each
	// within Timeout.
	Duration time.Duration
	// ThinkTime is each client's pause between the end of one stream and
	// its next request (default 0).
	ThinkTime time.Duration
	// DisconnectShare is the share of requests, 0 to 1, whose client hangs
	// up on purpose after a few chunks; they count as disconnected, not
	// lost (default 0).
	DisconnectShare float64
	// SlowReaderShare is the share of requests, 0 to 1, whose client
	// waits SlowReadDelay before each small read (default 0). Their
	// timings are left out of the latency percentiles.
	SlowReaderShare float64
	// SlowReadDelay is a slow reader's pause before each read (default 10ms).
	SlowReadDelay time.Duration
	// DistinctPrompts is how many prompt texts the requests cycle through,
	// "load test prompt #0" and on; 0 means 1 (default 1).
	DistinctPrompts int
	// Seed is the server's SIM_SEED, for Verify (default 1).
	Seed int64
	// Tokens is the server's SIM_TOKENS, for Verify and for choosing
	// where a disconnecting client hangs up (default 48).
	Tokens int
	// Verify compares each answer with llm.SimChunks of its prompt, Seed
	// and Tokens, cut to MaxTokens; it only makes sense against the
	// simulated provider (default true).
	Verify bool
	// MaxTokens is sent as max_tokens when positive (default 0: not sent).
	MaxTokens int
	// ImageBytes, when positive, makes each request's user message an
	// array of content parts: the prompt's text, then an image_url part
	// whose data URL carries ImageBytes bytes of base64 (rounded up to a
	// multiple of 4), as a chat client sends a photo inline. The answer
	// (and Verify) depends on the text only. Every request shares one
	// copy of the image, so the tool's memory does not grow with it
	// (default 0: a plain string prompt; at most MaxImageBytes).
	ImageBytes int
	// UserIDs spreads requests over this many X-User-ID identities,
	// "loadtest-user-0" and on; 0 sends no X-User-ID (default 0).
	UserIDs int
	// Timeout bounds each request from send to the end of its stream
	// (default 2m). A stream still open then is lost.
	Timeout time.Duration
	// Headers are added to every request; X-User-ID from UserIDs wins.
	Headers map[string]string
	// Mode is the API spoken: ModeSpillway (the default when empty) posts
	// Spillway requests and checks the /v1/stream contract; ModeOpenAI
	// posts OpenAI chat completion requests with "stream": true, to an
	// upstream such as simllm, and checks the answer the same way. Its
	// streams are counted under the path PathUpstream.
	Mode string
	// Model is sent as "model" in ModeOpenAI (default "sim-1").
	Model string
	// RampUp spreads the clients' first requests evenly over this long,
	// so that many connections are not opened in one burst (default 0).
	RampUp time.Duration
	// Slowest is how many completed streams with the longest first chunk
	// Result.Slowest lists, each with when it started in the run, its
	// client and whether that client's connection was reused: what the
	// tail of the first-chunk percentiles has in common (default 0: none;
	// at most MaxSlowest).
	Slowest int
}

// MaxSlowest bounds Config.Slowest.
const MaxSlowest = 10000

// The modes of Config.Mode.
const (
	ModeSpillway = "spillway"
	ModeOpenAI   = "openai"
)

// PathUpstream labels the streams of a ModeOpenAI run, which have no
// X-Stream-Path: they come from the upstream itself.
const PathUpstream = "upstream"

// DefaultModel is the model a ModeOpenAI run names when Config.Model is
// empty.
const DefaultModel = "sim-1"

func (c Config) openAI() bool { return c.Mode == ModeOpenAI }

// Validate reports the first inconsistency in c. It does not change c.
func (c Config) Validate() error {
	u, err := url.Parse(c.URL)
	switch {
	case err != nil:
		return fmt.Errorf("loadtest: url: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("loadtest: url %q: scheme must be http or https", c.URL)
	case u.Host == "":
		return fmt.Errorf("loadtest: url %q has no host", c.URL)
	case c.Concurrency < 1:
		return fmt.Errorf("loadtest: concurrency %d: need at least 1", c.Concurrency)
	case c.Requests < 0:
		return fmt.Errorf("loadtest: requests %d is negative", c.Requests)
	case c.Duration < 0:
		return fmt.Errorf("loadtest: duration %v is negative", c.Duration)
	case c.Requests == 0 && c.Duration == 0:
		return errors.New("loadtest: give a number of requests, a duration, or both")
	case c.ThinkTime < 0:
		return fmt.Errorf("loadtest: think time %v is negative", c.ThinkTime)
	case !(c.DisconnectShare >= 0 && c.DisconnectShare <= 1):
		return fmt.Errorf("loadtest: disconnect share %v is not between 0 and 1", c.DisconnectShare)
	case !(c.SlowReaderShare >= 0 && c.SlowReaderShare <= 1):
		return fmt.Errorf("loadtest: slow reader share %v is not between 0 and 1", c.SlowReaderShare)
	case c.SlowReadDelay < 0:
		return fmt.Errorf("loadtest: slow read delay %v is negative", c.SlowReadDelay)
	case c.SlowReaderShare > 0 && c.SlowReadDelay == 0:
		return errors.New("loadtest: slow readers need a slow read delay")
	case c.DistinctPrompts < 0:
		return fmt.Errorf("loadtest: distinct prompts %d is negative", c.DistinctPrompts)
	case c.Tokens < 0:
		return fmt.Errorf("loadtest: tokens %d is negative", c.Tokens)
	case c.Verify && c.Tokens == 0:
		return errors.New("loadtest: verify needs the server's token count")
	case c.MaxTokens < 0:
		return fmt.Errorf("loadtest: max tokens %d is negative", c.MaxTokens)
	case c.UserIDs < 0:
		return fmt.Errorf("loadtest: user ids %d is negative", c.UserIDs)
	case c.ImageBytes < 0 || c.ImageBytes > MaxImageBytes:
		return fmt.Errorf("loadtest: image bytes %d: want 0 to %d", c.ImageBytes, MaxImageBytes)
	case c.Timeout <= 0:
		return fmt.Errorf("loadtest: timeout %v: need a positive per-stream bound", c.Timeout)
	case c.Mode != "" && c.Mode != ModeSpillway && c.Mode != ModeOpenAI:
		return fmt.Errorf("loadtest: mode %q: want %s or %s", c.Mode, ModeSpillway, ModeOpenAI)
	case c.RampUp < 0:
		return fmt.Errorf("loadtest: ramp-up %v is negative", c.RampUp)
	case c.Slowest < 0 || c.Slowest > MaxSlowest:
		return fmt.Errorf("loadtest: slowest %d: want 0 to %d", c.Slowest, MaxSlowest)
	}
	for k, v := range c.Headers {
		if k == "" || strings.ContainsAny(k, " \t\r\n:\x00") {
			return fmt.Errorf("loadtest: header name %q is invalid", k)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("loadtest: header %s: value holds CR, LF or NUL", k)
		}
	}
	return nil
}

// Result is the outcome of a run. Every request sent is counted exactly
// once in Done, Errors, Refused, Disconnected, Aborted or Lost.
type Result struct {
	URL         string  `json:"url"`
	Elapsed     float64 `json:"elapsed_seconds"`
	Rate        float64 `json:"streams_per_second"`
	Verified    bool    `json:"verified"`
	Interrupted bool    `json:"interrupted"`

	Requests int `json:"requests"`
	// Done counts streams that ended in done and passed every check.
	Done int `json:"done"`
	// Errors counts streams that ended in a well-formed error event.
	Errors int `json:"errors"`
	// Refused counts non-200 answers.
	Refused int `json:"refused"`
	// Disconnected counts streams the tool hung up on purpose.
	Disconnected int `json:"disconnected"`
	// Aborted counts streams cut because the run itself was cancelled.
	Aborted int `json:"aborted"`
	// Lost counts streams that broke the contract; a correct server under
	// any load keeps it at 0.
	Lost int `json:"lost"`

	ErrorsByType map[string]int     `json:"errors_by_type"`
	RefusedBy    []Refusal          `json:"refused_by"`
	LostByReason map[LostReason]int `json:"lost_by_reason"`
	// LostSamples describes the first few lost streams.
	LostSamples []string `json:"lost_samples"`

	Pings  int `json:"pings"`
	Resets int `json:"resets"`
	// Paths counts 200 answers by X-Stream-Path ("unknown" when absent).
	Paths map[string]int `json:"paths"`
	// Latency holds percentiles of streams that ended in done, by path and
	// under "all", slow readers left out.
	Latency map[string]PathLatency `json:"latency"`
	// PingInterval summarizes, over every `: ping` of every stream, the
	// time since the previous ping or event on that stream (or since the
	// response headers for the first): heartbeat punctuality. Slow
	// readers are left out; all zero when no ping arrived.
	PingInterval Percentiles `json:"ping_interval"`
	// MaxGap summarizes each stream's longest silence between the
	// response headers, its pings and its events (Report.MaxGap), over
	// the streams that received anything, slow readers left out.
	MaxGap Percentiles `json:"max_gap"`
	// Slowest lists the Config.Slowest completed streams with the longest
	// first chunk, longest first (slow readers left out); empty unless
	// asked for.
	Slowest []StreamTiming `json:"slowest_first_chunk"`
}

// StreamTiming is one completed stream's timing and where it stood in the
// run.
type StreamTiming struct {
	Request   int     `json:"request"` // its index in the run, from 0
	RequestID string  `json:"request_id,omitempty"`
	Path      string  `json:"path"`
	Client    int     `json:"client"` // the client (0 to Concurrency-1) that sent it
	Seq       int     `json:"seq"`    // its place among that client's requests, from 0
	Reused    bool    `json:"reused"` // sent on a kept-alive connection
	StartMS   float64 `json:"start_ms"`
	FirstMS   float64 `json:"first_chunk_ms"`
	TotalMS   float64 `json:"total_ms"`
}

// Refusal counts non-200 answers of one status and problem type.
type Refusal struct {
	Status int    `json:"status"`
	Type   string `json:"type"`
	Count  int    `json:"count"`
	// RetryAfterMin and RetryAfterMax span the Retry-After values seen, in
	// seconds; NoRetryAfter counts answers without a usable one.
	RetryAfterMin int `json:"retry_after_min_seconds"`
	RetryAfterMax int `json:"retry_after_max_seconds"`
	NoRetryAfter  int `json:"without_retry_after"`
}

// PathLatency holds timings of completed streams on one path, from sending
// the request to the first chunk and to the done event.
type PathLatency struct {
	Count      int         `json:"count"`
	FirstChunk Percentiles `json:"first_chunk"`
	Total      Percentiles `json:"total"`
}

// Snapshot is the progress of a running load test.
type Snapshot struct {
	Elapsed      time.Duration
	Sent         int
	InFlight     int
	Done         int
	Errors       int
	Refused      int
	Disconnected int
	Aborted      int
	Lost         int
	// Rate is finished requests per second since the start.
	Rate float64
}

// ProgressInterval is how often Run reports progress.
const ProgressInterval = time.Second

// Problem types recorded for refusals that carry no usable problem document.
const (
	RefusalNotProblem = "(not problem+json)"
	RefusalNoType     = "(problem without type)"
)

const (
	maxLostSamples  = 20
	maxRefusalBody  = 64 << 10
	slowReadBytes   = 512
	maxCachedAnswer = 4096
)

// Run sends requests as cfg says until Requests have been sent or Duration
// has passed, waits for the streams under way, and returns the tally. When
// ctx ends, open streams are cut and counted as aborted and the result is
// marked interrupted. progress, when not nil, is called every
// ProgressInterval and once at the end, from one goroutine at a time. The
// error is non-nil only for an invalid cfg.
func Run(ctx context.Context, cfg Config, progress func(Snapshot)) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tr := newTransport(cfg.Concurrency)
	defer tr.CloseIdleConnections()
	r := &runner{
		cfg:    cfg,
		client: &http.Client{Transport: tr, CheckRedirect: noRedirect},
		start:  time.Now(),
		agg:    newAggregate(cfg.Slowest),
		image:  imageData(cfg.ImageBytes),
	}
	dispatch, cancel := ctx, context.CancelFunc(func() {})
	if cfg.Duration > 0 {
		dispatch, cancel = context.WithTimeout(ctx, cfg.Duration)
	}
	defer cancel()

	// The workers are waited for before the progress reporter is stopped,
	// so the last periodic snapshot never races the final one.
	var workers sync.WaitGroup
	for i := range cfg.Concurrency {
		delay := cfg.RampUp * time.Duration(i) / time.Duration(cfg.Concurrency)
		client := i
		workers.Go(func() {
			if delay > 0 {
				t := time.NewTimer(delay)
				select {
				case <-dispatch.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			r.worker(ctx, dispatch, client)
		})
	}
	stop := make(chan struct{})
	var reporter sync.WaitGroup
	if progress != nil {
		reporter.Go(func() {
			t := time.NewTicker(ProgressInterval)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					progress(r.snapshot())
				}
			}
		})
	}
	workers.Wait()
	close(stop)
	reporter.Wait()
	res := r.result(ctx.Err() != nil)
	if progress != nil {
		progress(r.snapshot())
	}
	return res, nil
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// newTransport returns a transport for many long-lived HTTP/1.1 streams to
// one host: no cap on connections, enough idle ones kept to reuse one per
// client, no proxy and no compression (either may buffer an event stream).
func newTransport(concurrency int) *http.Transport {
	protos := new(http.Protocols)
	protos.SetHTTP1(true)
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: concurrency,
		MaxConnsPerHost:     0,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		Protocols:           protos,
	}
}

type runner struct {
	cfg     Config
	client  *http.Client
	start   time.Time
	next    atomic.Int64
	answers sync.Map // prompt index → []string
	agg     *aggregate
	image   []byte // ImageBytes of base64, shared by every request; nil without
}

// worker is one client: it sends requests one after the other until the
// request budget is spent or dispatch ends.
func (r *runner) worker(ctx, dispatch context.Context, client int) {
	for seq := 0; dispatch.Err() == nil; seq++ {
		idx := r.next.Add(1) - 1
		if r.cfg.Requests > 0 && idx >= int64(r.cfg.Requests) {
			return
		}
		r.agg.begin()
		o := r.one(ctx, int(idx))
		o.client, o.seq = client, seq
		r.agg.record(o)
		if r.cfg.ThinkTime > 0 {
			t := time.NewTimer(r.cfg.ThinkTime)
			select {
			case <-dispatch.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

type kind int

const (
	kindDone kind = iota
	kindError
	kindRefused
	kindDisconnected
	kindAborted
	kindLost
)

// outcome is what became of one request.
type outcome struct {
	kind       kind
	idx        int
	requestID  string
	path       string
	slow       bool
	rep        Report
	status     int
	problem    string
	retryAfter int // seconds, -1 when absent
	reason     LostReason
	detail     string
	client     int
	seq        int
	reused     bool          // the request went on a kept-alive connection
	start      time.Duration // since the run's start
}

func (r *runner) prompts() int { return max(1, r.cfg.DistinctPrompts) }

// Prompt returns the prompt text of request idx of a run with n distinct
// prompts.
func Prompt(idx, n int) string {
	return fmt.Sprintf("load test prompt #%d", idx%max(1, n))
}

// want returns the expected chunks for the prompt of request idx.
func (r *runner) want(idx int, msgs []protocol.Message) []string {
	p := idx % r.prompts()
	if v, ok := r.answers.Load(p); ok {
		return v.([]string)
	}
	chunks := llm.SimChunks(msgs, r.cfg.Seed, r.cfg.Tokens)
	if r.cfg.MaxTokens > 0 && r.cfg.MaxTokens < len(chunks) {
		chunks = chunks[:r.cfg.MaxTokens]
	}
	if chunks == nil {
		chunks = []string{}
	}
	if p < maxCachedAnswer {
		r.answers.Store(p, chunks)
	}
	return chunks
}

// picked spreads a share of requests evenly: of the first n requests
// exactly floor(n·share) are picked. phase shifts which ones.
func picked(idx int, share, phase float64) bool {
	if share <= 0 {
		return false
	}
	return math.Floor(float64(idx+1)*share+phase) > math.Floor(float64(idx)*share+phase)
}

// one sends request idx and follows its stream to the end.
func (r *runner) one(ctx context.Context, idx int) outcome {
	o := outcome{idx: idx, retryAfter: -1}
	msgs := []protocol.Message{{Role: "user", Content: Prompt(idx, r.cfg.DistinctPrompts)}}
	body, err := r.body(msgs)
	if err != nil { // a struct of strings and ints cannot fail
		return r.lost(o, ReasonTransport, "encode request: %v", err)
	}
	rd, size, err := r.withImage(body)
	if err != nil {
		return r.lost(o, ReasonTransport, "encode request: %v", err)
	}
	var check StreamCheck
	if r.cfg.openAI() {
		check.Format = FormatOpenAI
	}
	if r.cfg.Verify {
		check.Want = r.want(idx, msgs)
	}
	if picked(idx, r.cfg.DisconnectShare, 0) {
		check.StopAfter = r.disconnectPoint(idx)
	}
	o.slow = picked(idx, r.cfg.SlowReaderShare, 0.5)

	sctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, http.MethodPost, r.cfg.URL, rd)
	if err != nil {
		return r.lost(o, ReasonTransport, "build request: %v", err)
	}
	req.ContentLength = size
	for k, v := range r.cfg.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if r.cfg.UserIDs > 0 {
		req.Header.Set("X-User-ID", fmt.Sprintf("loadtest-user-%d", idx%r.cfg.UserIDs))
	}

	if r.cfg.Slowest > 0 {
		req = req.WithContext(httptrace.WithClientTrace(sctx, &httptrace.ClientTrace{
			GotConn: func(ci httptrace.GotConnInfo) { o.reused = ci.Reused },
		}))
	}
	check.Start = time.Now()
	o.start = check.Start.Sub(r.start)
	resp, err := r.client.Do(req)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			o.kind = kindAborted
			return o
		case errors.Is(sctx.Err(), context.DeadlineExceeded):
			return r.lost(o, ReasonTimeout, "no response within %v", r.cfg.Timeout)
		}
		return r.lost(o, ReasonTransport, "%v", err)
	}
	defer resp.Body.Close()
	o.requestID = truncate(resp.Header.Get("X-Request-ID"), 64)

	if resp.StatusCode != http.StatusOK {
		return refusal(o, resp)
	}
	o.path = truncate(resp.Header.Get("X-Stream-Path"), 32)
	switch {
	case r.cfg.openAI():
		o.path = PathUpstream
	case o.path == "":
		o.path = "unknown"
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return r.lost(o, ReasonBadResponse, "200 with Content-Type %q", truncate(resp.Header.Get("Content-Type"), 64))
	}
	var src io.Reader = resp.Body
	if o.slow {
		src = &slowReader{r: resp.Body, delay: r.cfg.SlowReadDelay, done: sctx.Done()}
	}
	o.rep = check.Check(src)
	rep := o.rep
	switch {
	case rep.Stopped:
		o.kind = kindDisconnected
		return o
	case rep.Err != nil && ctx.Err() != nil:
		o.kind = kindAborted
		return o
	case rep.Err != nil && errors.Is(sctx.Err(), context.DeadlineExceeded):
		return r.lost(o, ReasonTimeout, "stream still open after %v (%d chunks, terminal %q)", r.cfg.Timeout, rep.Chunks, rep.Terminal)
	case rep.Lost:
		return r.lost(o, rep.Reason, "%s", rep.Detail)
	case rep.Terminal == protocol.EventDone:
		o.kind = kindDone
	default:
		o.kind = kindError
		o.problem = rep.Problem.Type
	}
	return o
}

// openAIRequest is the body of a ModeOpenAI request.
type openAIRequest struct {
	Model     string `json:"model"`
	Messages  any    `json:"messages"` // []protocol.Message or []partsMessage
	MaxTokens int    `json:"max_tokens,omitempty"`
	Stream    bool   `json:"stream"`
}

// body encodes the request for msgs in the run's mode; with an image, its
// data URL is left empty for withImage to fill.
func (r *runner) body(msgs []protocol.Message) ([]byte, error) {
	var out any = msgs
	if r.image != nil {
		pm := make([]partsMessage, len(msgs))
		for i, m := range msgs {
			pm[i] = partsMessage{Role: m.Role, Content: []contentPart{{Type: "text", Text: m.Content},
				{Type: "image_url", ImageURL: &imageURL{URL: imagePrefix}}}}
		}
		out = pm
	}
	if r.cfg.openAI() {
		model := r.cfg.Model
		if model == "" {
			model = DefaultModel
		}
		return json.Marshal(openAIRequest{Model: model, Messages: out, MaxTokens: r.cfg.MaxTokens, Stream: true})
	}
	return json.Marshal(spillwayRequest{Messages: out, MaxTokens: r.cfg.MaxTokens})
}

// MaxImageBytes bounds Config.ImageBytes: a body must stay within the
// api's MAX_BODY_BYTES, at most 63 MiB.
const MaxImageBytes = 63 << 20

// imagePrefix starts the data URL of the image part.
const imagePrefix = "data:image/png;base64,"

type partsMessage struct {
	Role    string        `json:"role"`
	Content []contentPart `json:"content"`
}

type contentPart struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *imageURL `json:"image_url,omitempty"`
}

type imageURL struct {
	URL string `json:"url"`
}

type spillwayRequest struct {
	Messages  any `json:"messages"`
	MaxTokens int `json:"max_tokens,omitempty"`
}

// imageData is n bytes of base64 (n rounded up to a multiple of 4); nil
// for n = 0.
func imageData(n int) []byte {
	if n <= 0 {
		return nil
	}
	return bytes.Repeat([]byte("iVBO"), (n+3)/4)
}

// withImage returns body with the run's image spliced into every image
// part's data URL, as a reader over the shared image, and its length.
func (r *runner) withImage(body []byte) (io.Reader, int64, error) {
	if r.image == nil {
		return bytes.NewReader(body), int64(len(body)), nil
	}
	mark := []byte(imagePrefix + `"`)
	var parts []io.Reader
	size := int64(0)
	for {
		i := bytes.Index(body, mark)
		if i < 0 {
			break
		}
		cut := i + len(imagePrefix)
		parts = append(parts, bytes.NewReader(body[:cut]), bytes.NewReader(r.image))
		size += int64(cut + len(r.image))
		body = body[cut:]
	}
	if parts == nil {
		return nil, 0, errors.New("no image part in the request")
	}
	parts = append(parts, bytes.NewReader(body))
	return io.MultiReader(parts...), size + int64(len(body)), nil
}

// disconnectPoint picks after how many chunks request idx hangs up: early
// in the expected answer, so the server sees a client leave mid-stream.
func (r *runner) disconnectPoint(idx int) int {
	n := r.cfg.Tokens
	if r.cfg.MaxTokens > 0 && (n == 0 || r.cfg.MaxTokens < n) {
		n = r.cfg.MaxTokens
	}
	if n == 0 {
		n = 8
	}
	rng := rand.New(rand.NewPCG(uint64(r.cfg.Seed), uint64(idx)))
	return 1 + rng.IntN(max(1, n/2))
}

func (r *runner) lost(o outcome, reason LostReason, format string, args ...any) outcome {
	o.kind = kindLost
	o.reason = reason
	o.detail = fmt.Sprintf(format, args...)
	return o
}

// refusal reads the problem document and Retry-After of a non-200 answer.
func refusal(o outcome, resp *http.Response) outcome {
	o.kind = kindRefused
	o.status = resp.StatusCode
	o.problem = RefusalNotProblem
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/problem+json" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBody))
		var p protocol.Problem
		switch {
		case strictJSON(b, &p) != nil:
		case p.Type == "":
			o.problem = RefusalNoType
		default:
			o.problem = truncate(p.Type, 128)
		}
	}
	if s, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		o.retryAfter = s
	}
	return o
}

// parseRetryAfter reads a Retry-After header in seconds or as an HTTP date.
func parseRetryAfter(v string, now time.Time) (int, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return 0, false
		}
		return n, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, int(math.Ceil(t.Sub(now).Seconds()))), true
}

// slowReader waits delay before each read and reads at most slowReadBytes,
// like a client on a poor link.
type slowReader struct {
	r     io.Reader
	delay time.Duration
	done  <-chan struct{}
}

var errSlowReadCancelled = errors.New("loadtest: slow read cancelled")

func (s *slowReader) Read(p []byte) (int, error) {
	t := time.NewTimer(s.delay)
	select {
	case <-s.done:
		t.Stop()
		return 0, errSlowReadCancelled
	case <-t.C:
	}
	if len(p) > slowReadBytes {
		p = p[:slowReadBytes]
	}
	return s.r.Read(p)
}

// aggregate tallies outcomes; safe for concurrent use.
type aggregate struct {
	mu           sync.Mutex
	sent         int
	done         int
	errors       int
	refused      int
	disconnected int
	aborted      int
	lost         int
	errTypes     map[string]int
	refusals     map[refusalKey]*Refusal
	lostReasons  map[LostReason]int
	lostSamples  []string
	pings        int
	resets       int
	paths        map[string]int
	first        map[string]*sampler
	total        map[string]*sampler
	pingIvl      *sampler
	maxGap       *sampler
	slowestN     int
	slowest      []StreamTiming // up to 2×slowestN, cut back to slowestN when full
}

// noteSlowest keeps o among the slowest first chunks if it is one.
func (a *aggregate) noteSlowest(o outcome) {
	if a.slowestN == 0 {
		return
	}
	f := ms(o.rep.FirstChunk)
	if len(a.slowest) >= a.slowestN && f <= a.slowest[a.slowestN-1].FirstMS {
		return
	}
	a.slowest = append(a.slowest, StreamTiming{Request: o.idx, RequestID: o.requestID, Path: o.path,
		Client: o.client, Seq: o.seq, Reused: o.reused, StartMS: ms(o.start), FirstMS: f, TotalMS: ms(o.rep.Total)})
	if len(a.slowest) >= 2*a.slowestN || len(a.slowest) <= a.slowestN {
		a.cutSlowest()
	}
}

// cutSlowest sorts the slowest list, longest first, and cuts it to
// slowestN.
func (a *aggregate) cutSlowest() {
	slices.SortStableFunc(a.slowest, func(x, y StreamTiming) int { return cmp.Compare(y.FirstMS, x.FirstMS) })
	a.slowest = a.slowest[:min(len(a.slowest), a.slowestN)]
}

type refusalKey struct {
	status int
	typ    string
}

func newAggregate(slowest int) *aggregate {
	return &aggregate{
		slowestN:    slowest,
		errTypes:    map[string]int{},
		refusals:    map[refusalKey]*Refusal{},
		lostReasons: map[LostReason]int{},
		paths:       map[string]int{},
		first:       map[string]*sampler{},
		total:       map[string]*sampler{},
		pingIvl:     newSampler(1 << 32),
		maxGap:      newSampler(1<<32 + 1),
	}
}

func (a *aggregate) begin() {
	a.mu.Lock()
	a.sent++
	a.mu.Unlock()
}

func (a *aggregate) record(o outcome) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pings += o.rep.Pings
	a.resets += o.rep.Resets
	if !o.slow {
		for _, d := range o.rep.PingIntervals {
			a.pingIvl.add(d)
		}
		if o.rep.MaxGap > 0 {
			a.maxGap.add(o.rep.MaxGap)
		}
	}
	if o.path != "" {
		a.paths[o.path]++
	}
	switch o.kind {
	case kindDone:
		a.done++
		if !o.slow {
			for _, p := range []string{o.path, "all"} {
				a.sample(a.first, p).add(o.rep.FirstChunk)
				a.sample(a.total, p).add(o.rep.Total)
			}
			a.noteSlowest(o)
		}
	case kindError:
		a.errors++
		a.errTypes[o.problem]++
	case kindRefused:
		a.refused++
		k := refusalKey{o.status, o.problem}
		rf := a.refusals[k]
		if rf == nil {
			rf = &Refusal{Status: o.status, Type: o.problem}
			a.refusals[k] = rf
		}
		if o.retryAfter < 0 {
			rf.NoRetryAfter++
		} else {
			if rf.Count == rf.NoRetryAfter || o.retryAfter < rf.RetryAfterMin {
				rf.RetryAfterMin = o.retryAfter
			}
			rf.RetryAfterMax = max(rf.RetryAfterMax, o.retryAfter)
		}
		rf.Count++
	case kindDisconnected:
		a.disconnected++
	case kindAborted:
		a.aborted++
	case kindLost:
		a.lost++
		a.lostReasons[o.reason]++
		if len(a.lostSamples) < maxLostSamples {
			s := fmt.Sprintf("request %d", o.idx)
			if o.requestID != "" {
				s += " id=" + o.requestID
			}
			if o.path != "" {
				s += " path=" + o.path
			}
			a.lostSamples = append(a.lostSamples, fmt.Sprintf("%s: %s: %s", s, o.reason, o.detail))
		}
	}
}

func (a *aggregate) sample(m map[string]*sampler, path string) *sampler {
	s := m[path]
	if s == nil {
		s = newSampler(uint64(len(m)))
		m[path] = s
	}
	return s
}

func (r *runner) snapshot() Snapshot {
	a := r.agg
	a.mu.Lock()
	defer a.mu.Unlock()
	el := time.Since(r.start)
	finished := a.done + a.errors + a.refused + a.disconnected + a.aborted + a.lost
	return Snapshot{
		Elapsed:      el,
		Sent:         a.sent,
		InFlight:     a.sent - finished,
		Done:         a.done,
		Errors:       a.errors,
		Refused:      a.refused,
		Disconnected: a.disconnected,
		Aborted:      a.aborted,
		Lost:         a.lost,
		Rate:         float64(finished) / max(el.Seconds(), 1e-9),
	}
}

func (r *runner) result(interrupted bool) *Result {
	a := r.agg
	a.mu.Lock()
	defer a.mu.Unlock()
	el := time.Since(r.start)
	res := &Result{
		URL:          r.cfg.URL,
		Elapsed:      el.Seconds(),
		Verified:     r.cfg.Verify,
		Interrupted:  interrupted,
		Requests:     a.sent,
		Done:         a.done,
		Errors:       a.errors,
		Refused:      a.refused,
		Disconnected: a.disconnected,
		Aborted:      a.aborted,
		Lost:         a.lost,
		ErrorsByType: a.errTypes,
		RefusedBy:    []Refusal{},
		LostByReason: a.lostReasons,
		LostSamples:  append([]string{}, a.lostSamples...),
		Pings:        a.pings,
		Resets:       a.resets,
		Paths:        a.paths,
		Latency:      map[string]PathLatency{},
		PingInterval: a.pingIvl.percentiles(),
		MaxGap:       a.maxGap.percentiles(),
	}
	a.cutSlowest()
	res.Slowest = append([]StreamTiming{}, a.slowest...)
	res.Rate = float64(a.sent) / max(el.Seconds(), 1e-9)
	for _, rf := range a.refusals {
		res.RefusedBy = append(res.RefusedBy, *rf)
	}
	sortRefusals(res.RefusedBy)
	for p, s := range a.first {
		res.Latency[p] = PathLatency{
			Count:      int(s.seen),
			FirstChunk: s.percentiles(),
			Total:      a.total[p].percentiles(),
		}
	}
	return res
}
