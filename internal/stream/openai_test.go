package stream_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func chatHandler(tb testing.TB, d deps, models ...string) (*stream.OpenAI, http.Handler) {
	tb.Helper()
	o := stream.NewOpenAI(newHandler(tb, d), models)
	return o, http.HandlerFunc(o.ChatCompletions)
}

const streamBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`

// dataLines returns the `data:` payloads of an SSE body, and whether a
// `: ping` comment or a named event appeared (neither belongs in OpenAI's).
func dataLines(tb testing.TB, body string) []string {
	tb.Helper()
	var out []string
	for _, frame := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		if frame == ": ping" {
			continue
		}
		d, ok := strings.CutPrefix(frame, "data: ")
		if !ok || strings.Contains(d, "\n") {
			tb.Fatalf("frame %q is not one data line", frame)
		}
		out = append(out, d)
	}
	return out
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *protocol.Usage `json:"usage"`
	Error *openaiwire.Error
}

func decodeChunks(tb testing.TB, body string) (chunks []chunk, done bool) {
	tb.Helper()
	for _, d := range dataLines(tb, body) {
		if done {
			tb.Fatalf("data after [DONE]: %q", d)
		}
		if d == "[DONE]" {
			done = true
			continue
		}
		var c chunk
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			tb.Fatalf("chunk %q: %v", d, err)
		}
		chunks = append(chunks, c)
	}
	return chunks, done
}

// answer joins the contents of chunks.
func answer(chunks []chunk) string {
	var b strings.Builder
	for _, c := range chunks {
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil {
				b.WriteString(*ch.Delta.Content)
			}
		}
	}
	return b.String()
}

func TestOpenAIStreamDirect(t *testing.T) {
	t.Parallel()
	_, h := chatHandler(t, deps{pool: &fakePool{free: 1}, provider: &fakeProvider{chunks: []string{"Hel", "lo"}}, gate: &fakeGate{}})
	w := post(h, streamBody, nil)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/event-stream" ||
		w.Header().Get("X-Stream-Path") != protocol.PathDirect || len(w.Header()[stream.RequestIDHeader]) != 1 {
		t.Fatalf("HTTP %d headers %v", w.Code, w.Header())
	}
	chunks, done := decodeChunks(t, w.Body.String())
	if !done || len(chunks) != 4 {
		t.Fatalf("done %v, %d chunks in %q; want content, content, finish, usage", done, len(chunks), w.Body.String())
	}
	id := "chatcmpl-" + w.Header()[stream.RequestIDHeader][0]
	for i, c := range chunks {
		if c.ID != id || c.Object != "chat.completion.chunk" || c.Model != "m" {
			t.Errorf("chunk %d: %+v", i, c)
		}
	}
	if chunks[0].Choices[0].Delta.Role != "assistant" || chunks[1].Choices[0].Delta.Role != "" {
		t.Error("the role must be in the first delta only")
	}
	if f := chunks[2].Choices[0].FinishReason; f == nil || *f != "stop" || chunks[1].Choices[0].FinishReason != nil {
		t.Error("finish_reason must be on the last choice chunk only")
	}
	if len(chunks[3].Choices) != 0 || chunks[3].Usage == nil || chunks[3].Usage.CompletionTokens != 2 {
		t.Errorf("usage chunk %+v", chunks[3])
	}
	if answer(chunks) != "Hello" {
		t.Errorf("answer %q", answer(chunks))
	}
}

// A reset before anything was sent continues seamlessly; after chunks were
// sent it ends the stream with an error, without [DONE], never mixing the
// two attempts, and the job is cancelled.
func TestOpenAIStreamTakeover(t *testing.T) {
	t.Parallel()
	batch := func(seq int, s string) protocol.Result {
		return protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: seq, Content: s}}}
	}
	reset := protocol.Result{Kind: protocol.KindReset, Reset: &protocol.Reset{Attempt: 2}}
	done := protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "stop"}}

	t.Run("before the first chunk", func(t *testing.T) {
		t.Parallel()
		relay := newFakeRelay(reset, batch(1, "second"), done)
		_, h := chatHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: &fakeSpiller{relay: relay}, gate: &fakeGate{}})
		w := post(h, streamBody, nil)
		chunks, ended := decodeChunks(t, w.Body.String())
		if w.Header().Get("X-Stream-Path") != protocol.PathQueued || !ended || answer(chunks) != "second" {
			t.Fatalf("body %q", w.Body.String())
		}
		if completed := <-relay.closed; !completed {
			t.Error("relay closed as incomplete after done")
		}
	})
	t.Run("after a chunk", func(t *testing.T) {
		t.Parallel()
		relay := newFakeRelay(batch(1, "first"), reset, batch(1, "second"), done)
		_, h := chatHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: &fakeSpiller{relay: relay}, gate: &fakeGate{}})
		w := post(h, streamBody, nil)
		chunks, ended := decodeChunks(t, w.Body.String())
		if ended || len(chunks) != 2 || answer(chunks) != "first" {
			t.Fatalf("body %q: want the first chunk then an error", w.Body.String())
		}
		if e := chunks[1].Error; e == nil || e.Type != "server_error" || e.Code != "worker_lost" || e.Message == "" {
			t.Fatalf("last line %+v, want a worker_lost error", chunks[1])
		}
		if completed := <-relay.closed; completed {
			t.Error("relay closed as complete: the restarted job would run for nobody")
		}
	})
	t.Run("not streamed", func(t *testing.T) {
		t.Parallel()
		relay := newFakeRelay(batch(1, "first"), reset, batch(1, "sec"), batch(2, "ond"), done)
		_, h := chatHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: &fakeSpiller{relay: relay}, gate: &fakeGate{}})
		w := post(h, validBody, nil)
		var c openaiwire.Completion
		if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil || w.Code != http.StatusOK {
			t.Fatalf("HTTP %d body %q: %v", w.Code, w.Body.String(), err)
		}
		if c.Object != "chat.completion" || len(c.Choices) != 1 || c.Choices[0].Message.Content != "second" ||
			c.Choices[0].Message.Role != "assistant" || c.Choices[0].FinishReason != "stop" {
			t.Fatalf("completion %+v", c)
		}
	})
}

func openAIErrorOf(tb testing.TB, w *httptest.ResponseRecorder) openaiwire.Error {
	tb.Helper()
	var b openaiwire.ErrorBody
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		tb.Fatalf("Content-Type %q body %q", ct, w.Body.String())
	}
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || b.Error.Message == "" || b.Error.Type == "" || b.Error.Code == "" {
		tb.Fatalf("body %q is not an OpenAI error: %v", w.Body.String(), err)
	}
	return b.Error
}

// An upstream that refuses a streamed request after a while still has
// its status and body passed through: a direct stream's header hold
// (the native endpoint's) does not start an OpenAI answer.
func TestOpenAISlowUpstreamRefusalPassesThrough(t *testing.T) {
	t.Parallel()
	body := `{"error":{"message":"bad tool schema","type":"invalid_request_error","param":"tools","code":null}}`
	prov := &fakeProvider{before: 300 * time.Millisecond,
		err: &llm.Error{Status: http.StatusBadRequest, Err: errors.New("upstream 400"), Body: []byte(body)}}
	_, h := chatHandler(t, deps{pool: &fakePool{free: 1}, provider: prov, gate: &fakeGate{}})
	w := post(h, streamBody, nil)
	if w.Code != http.StatusBadRequest || strings.TrimSpace(w.Body.String()) != body {
		t.Fatalf("HTTP %d body %q; want the upstream's 400 and body", w.Code, w.Body.String())
	}
}

// Refusals, and failures before anything was sent, are HTTP errors in
// OpenAI's shape with the problem's status and Retry-After; a failure
// after the first chunk is an error line and no [DONE].
func TestOpenAIErrors(t *testing.T) {
	t.Parallel()
	failing := func(chunks ...string) *fakeProvider {
		return &fakeProvider{chunks: chunks, err: &llm.Error{Retryable: true, RetryAfter: 3 * time.Second, Err: io.ErrUnexpectedEOF}}
	}
	for _, tt := range []struct {
		name       string
		d          deps
		body       string
		status     int
		typ, code  string
		retryAfter string
	}{
		{"bad request", deps{pool: &fakePool{free: 1}, provider: &fakeProvider{}, gate: &fakeGate{}},
			`{"messages":[]}`, 400, "invalid_request_error", "invalid_request", ""},
		{"rate limited", deps{pool: &fakePool{free: 1}, provider: &fakeProvider{}, gate: &fakeGate{admit: protocol.RateLimited(2)}},
			validBody, 429, "rate_limit_error", "rate_limit_exceeded", "2"},
		{"queue overflow", deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: &fakeSpiller{},
			gate: &fakeGate{mayQueue: protocol.QueueOverflow(7)}}, validBody, 503, "server_error", "queue_overflow", "7"},
		{"unauthorized", deps{pool: &fakePool{free: 1}, provider: &fakeProvider{}, gate: &fakeGate{}, keys: []string{"k"}},
			validBody, 401, "authentication_error", "invalid_api_key", ""},
		{"provider failed before a chunk, streamed", deps{pool: &fakePool{free: 1}, provider: failing(), gate: &fakeGate{}},
			streamBody, 502, "server_error", "provider_error", "3"},
		{"provider failed after a chunk, not streamed", deps{pool: &fakePool{free: 1}, provider: failing("a"), gate: &fakeGate{}},
			validBody, 502, "server_error", "provider_error", "3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, h := chatHandler(t, tt.d)
			w := post(h, tt.body, nil)
			e := openAIErrorOf(t, w)
			if w.Code != tt.status || e.Type != tt.typ || e.Code != tt.code || w.Header().Get("Retry-After") != tt.retryAfter {
				t.Fatalf("HTTP %d Retry-After %q error %+v", w.Code, w.Header().Get("Retry-After"), e)
			}
			if len(w.Header()[stream.RequestIDHeader]) != 1 {
				t.Error("no X-Request-ID on the error")
			}
		})
	}
	t.Run("provider failed after a chunk, streamed", func(t *testing.T) {
		t.Parallel()
		_, h := chatHandler(t, deps{pool: &fakePool{free: 1}, provider: failing("a"), gate: &fakeGate{}})
		w := post(h, streamBody, nil)
		chunks, done := decodeChunks(t, w.Body.String())
		if w.Code != http.StatusOK || done || len(chunks) != 2 || answer(chunks) != "a" {
			t.Fatalf("HTTP %d body %q", w.Code, w.Body.String())
		}
		if e := chunks[1].Error; e == nil || e.Code != "provider_error" {
			t.Fatalf("last line %+v", chunks[1])
		}
	})
}

// The model routes take the same credentials as the other endpoints and
// refuse others in OpenAI's error shape, before the catalog is asked.
func TestOpenAIGuard(t *testing.T) {
	t.Parallel()
	o, _ := chatHandler(t, deps{pool: &fakePool{}, provider: &fakeProvider{}, gate: &fakeGate{}, keys: []string{"k"}}, "sim")
	var served int
	guarded := o.Guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served++
		_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
	}))
	get := func(auth string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		guarded.ServeHTTP(w, r)
		return w
	}
	for _, auth := range []string{"", "Bearer wrong"} {
		if w := get(auth); w.Code != http.StatusUnauthorized || openAIErrorOf(t, w).Code != "invalid_api_key" || served != 0 {
			t.Fatalf("key %q: HTTP %d %q, served %d", auth, w.Code, w.Body.String(), served)
		}
	}
	if w := get("Bearer k"); w.Code != http.StatusOK || w.Body.String() != `{"object":"list","data":[]}` || served != 1 {
		t.Fatalf("with the key: HTTP %d %q, served %d", w.Code, w.Body.String(), served)
	}
}

// recLog records what a session hands the stream log.
type recLog struct {
	mu     sync.Mutex
	opened []string
	events map[string][]streamlog.Event
}

func (l *recLog) Open(requestID, _ string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.opened = append(l.opened, requestID)
	return true
}

func (l *recLog) Append(requestID string, ev streamlog.Event) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == nil {
		l.events = make(map[string][]streamlog.Event)
	}
	l.events[requestID] = append(l.events[requestID], ev)
	return true
}

func (l *recLog) snapshot() ([]string, map[string][]streamlog.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.opened...), maps.Clone(l.events)
}

// blockingProvider emits one chunk, then holds the call until it is
// cancelled.
type blockingProvider struct{ emitted chan struct{} }

func (blockingProvider) Name() string { return "blocking" }

func (p blockingProvider) Stream(ctx context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	if err := emit(protocol.Chunk{Content: "a"}); err != nil {
		return llm.Result{}, err
	}
	close(p.emitted)
	<-ctx.Done()
	return llm.Result{}, ctx.Err()
}

func resumableHandler(tb testing.TB, p llm.Provider, log *recLog) *stream.Handler {
	tb.Helper()
	h, err := stream.New(stream.Config{
		MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		DirectPathEnabled: true, ResumeWindow: time.Hour, LogTTL: 2 * time.Hour,
	}, stream.Deps{Pool: &fakePool{free: 2}, Provider: p, Gate: &fakeGate{}, Log: testutil.DiscardLogger(), LogWriter: log})
	if err != nil {
		tb.Fatalf("stream.New: %v", err)
	}
	return h
}

// Only /v1/stream's streams are logged, with ids 1, 2, 3, …; a chat
// completion's chunks carry no ids and nothing of it is logged
// (docs/API.md, "Resume and stop").
func TestOpenAIStreamIsNotLogged(t *testing.T) {
	t.Parallel()
	log := &recLog{}
	h := resumableHandler(t, &fakeProvider{chunks: []string{"Hel", "lo"}}, log)
	native := post(h, validBody, nil)
	chat := post(http.HandlerFunc(stream.NewOpenAI(h, []string{"m"}).ChatCompletions), streamBody, nil)
	if native.Code != http.StatusOK || chat.Code != http.StatusOK {
		t.Fatalf("HTTP %d and %d", native.Code, chat.Code)
	}
	if strings.Contains(chat.Body.String(), "id: ") || answer(mustChunks(t, chat.Body.String())) != "Hello" {
		t.Fatalf("chat completion body %q", chat.Body.String())
	}
	opened, events := log.snapshot()
	nativeID := native.Header()[stream.RequestIDHeader][0]
	if len(opened) != 1 || opened[0] != nativeID || len(events) != 1 {
		t.Fatalf("logs opened %v with events %v; want only the /v1/stream one, %s", opened, events, nativeID)
	}
	evs := events[nativeID]
	if len(evs) != 3 || evs[2].Name != protocol.EventDone {
		t.Fatalf("logged %+v; want two chunks and done", evs)
	}
	for i, ev := range evs {
		if ev.ID != int64(i+1) {
			t.Fatalf("event %d has id %d", i, ev.ID)
		}
	}
}

func mustChunks(tb testing.TB, body string) []chunk {
	tb.Helper()
	chunks, done := decodeChunks(tb, body)
	if !done {
		tb.Fatalf("no [DONE] in %q", body)
	}
	return chunks
}

// A chat completion whose client leaves is cancelled at once, resume
// window or not: nobody could resume it.
func TestOpenAIClientGoneCancelsDespiteResumeWindow(t *testing.T) {
	t.Parallel()
	p := blockingProvider{emitted: make(chan struct{})}
	h := resumableHandler(t, p, &recLog{})
	o := stream.NewOpenAI(h, []string{"m"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", strings.NewReader(streamBody))
	r.Header.Set("Content-Type", "application/json")
	served := make(chan struct{})
	go func() {
		defer close(served)
		o.ChatCompletions(httptest.NewRecorder(), r)
	}()
	select {
	case <-p.emitted:
	case <-time.After(10 * time.Second):
		t.Fatal("the provider was never called")
	}
	cancel()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the chat completion outlived its client: it went on as if resumable")
	}
}
