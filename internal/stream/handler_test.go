package stream_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Hand-written fakes of the handler's dependencies.

// fakePool grants TryAcquire while free > 0 and records who asked.
type fakePool struct {
	mu       sync.Mutex
	free     int
	err      error // the refusal when none is free
	asked    []string
	released int
}

type fakeLease struct{ p *fakePool }

func (l fakeLease) Release() {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	l.p.free++
	l.p.released++
}

func (p *fakePool) TryAcquire(_ context.Context, user string) (pool.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, user)
	if p.free == 0 {
		return nil, p.err
	}
	p.free--
	return fakeLease{p}, nil
}

func (p *fakePool) Acquire(ctx context.Context, user string) (pool.Lease, error) {
	return nil, errors.New("fakePool: Acquire is the worker's, not the handler's")
}

func (p *fakePool) Stats() pool.Stats { return pool.Stats{Capacity: 1} }

func (p *fakePool) state() (asked []string, released int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.asked...), p.released
}

// fakeProvider emits chunks, then returns err or a stop; with before
// set, it first waits that long, as a slow upstream.
type fakeProvider struct {
	chunks []string
	err    error
	calls  int
	before time.Duration
}

func (f *fakeProvider) Name() string { return "fake" }

func (f *fakeProvider) Stream(ctx context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	f.calls++
	if f.before > 0 {
		select {
		case <-time.After(f.before):
		case <-ctx.Done():
			return llm.Result{}, ctx.Err()
		}
	}
	for _, c := range f.chunks {
		if err := emit(protocol.Chunk{Content: c}); err != nil {
			return llm.Result{}, err
		}
	}
	if f.err != nil {
		return llm.Result{}, f.err
	}
	return llm.Result{FinishReason: "stop", Usage: protocol.Usage{CompletionTokens: len(f.chunks)}}, nil
}

// fakeSpiller records the jobs it takes and relays what the test sends.
type fakeSpiller struct {
	mu     sync.Mutex
	jobs   []protocol.Job
	refuse error
	relay  *fakeRelay
}

func (s *fakeSpiller) Spill(_ context.Context, job protocol.Job) (failover.Relay, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobs = append(s.jobs, job)
	if s.refuse != nil {
		return nil, s.refuse
	}
	return s.relay, nil
}

type fakeRelay struct {
	results chan protocol.Result
	done    chan struct{}
	closed  chan bool
}

func newFakeRelay(rs ...protocol.Result) *fakeRelay {
	r := &fakeRelay{results: make(chan protocol.Result, len(rs)), done: make(chan struct{}), closed: make(chan bool, 1)}
	for _, x := range rs {
		r.results <- x
	}
	return r
}

func (r *fakeRelay) Results() <-chan protocol.Result { return r.results }
func (r *fakeRelay) Done() <-chan struct{}           { return r.done }
func (r *fakeRelay) Problem() *protocol.Problem      { return protocol.WorkerLost(1) }
func (r *fakeRelay) Close(completed bool)            { r.closed <- completed }

// fakeGate answers from its fields.
type fakeGate struct {
	admit      *protocol.Problem
	mayQueue   *protocol.Problem
	queueFirst bool
	maxTokens  int // MaxTokens' answer for every priority
	retryAfter time.Duration
	mu         sync.Mutex
	served     []time.Duration
	admitted   []protocol.Priority // priorities Admit was asked about
	queuing    []protocol.Priority // priorities MayQueue was asked about
}

func (g *fakeGate) Admit(_ context.Context, _ string, prio protocol.Priority) *protocol.Problem {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.admitted = append(g.admitted, prio)
	return g.admit
}

func (g *fakeGate) MayQueue(prio protocol.Priority) *protocol.Problem {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.queuing = append(g.queuing, prio)
	return g.mayQueue
}

func (g *fakeGate) MaxTokens(protocol.Priority) int { return g.maxTokens }
func (g *fakeGate) QueueFirst() bool                { return g.queueFirst }
func (g *fakeGate) RetryAfter() time.Duration       { return g.retryAfter }
func (g *fakeGate) ServiceDone(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.served = append(g.served, d)
}

type deps struct {
	pool     *fakePool
	provider *fakeProvider
	spiller  *fakeSpiller // nil: no queue
	gate     *fakeGate
	keys     []string
	// priorityMax is PRIORITY_MAX; empty takes the default.
	priorityMax protocol.Priority
}

func newHandler(tb testing.TB, d deps) *stream.Handler {
	tb.Helper()
	sd := stream.Deps{Pool: d.pool, Provider: d.provider, Gate: d.gate, Log: testutil.DiscardLogger()}
	if d.spiller != nil {
		sd.Spiller = d.spiller
	}
	h, err := stream.New(stream.Config{
		MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		DirectPathEnabled: true, APIKeys: d.keys, PriorityMax: d.priorityMax,
		TakeOverAfter: -1, // over a real connection, a queued stream takes it at once
	}, sd)
	if err != nil {
		tb.Fatalf("stream.New: %v", err)
	}
	return h
}

const validBody = `{"messages":[{"role":"user","content":"hi"}]}`

func post(h http.Handler, body string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/stream", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func problemOf(tb testing.TB, w *httptest.ResponseRecorder) protocol.Problem {
	tb.Helper()
	var p protocol.Problem
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		tb.Fatalf("Content-Type %q, body %q; want a problem", ct, w.Body.String())
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		tb.Fatalf("decode problem: %v", err)
	}
	if p.Status != w.Code || !strings.HasPrefix(p.Instance, "urn:spillway:request:") {
		tb.Fatalf("problem %+v with HTTP %d: status or instance wrong", p, w.Code)
	}
	return p
}

func TestHandlerDirectPath(t *testing.T) {
	t.Parallel()
	p := &fakePool{free: 1}
	gate := &fakeGate{}
	h := newHandler(t, deps{pool: p, provider: &fakeProvider{chunks: []string{"Hel", "lo"}}, spiller: &fakeSpiller{}, gate: gate})
	w := post(h, validBody, map[string]string{"X-User-ID": "alice"})
	body := w.Body.String()
	if w.Code != http.StatusOK || w.Header().Get("X-Stream-Path") != protocol.PathDirect {
		t.Fatalf("HTTP %d path %q body %q, want a direct stream", w.Code, w.Header().Get("X-Stream-Path"), body)
	}
	for _, want := range []string{`"content":"Hel"`, `"content":"lo"`, "event: done", `"path":"direct"`} {
		if !strings.Contains(body, want) {
			t.Errorf("stream lacks %q: %q", want, body)
		}
	}
	asked, released := p.state()
	if len(asked) != 1 || asked[0] != "user:alice" || released != 1 {
		t.Errorf("pool asked for %q, released %d; want alice once, released once", asked, released)
	}
	if len(gate.served) != 1 {
		t.Errorf("gate told of %d served streams, want 1", len(gate.served))
	}
}

func TestHandlerQueuedPath(t *testing.T) {
	t.Parallel()
	relay := newFakeRelay(
		protocol.Result{Kind: protocol.KindHeartbeat},
		protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: "queued hi"}}},
		protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{FinishReason: "length"}},
	)
	sp := &fakeSpiller{relay: relay}
	prov := &fakeProvider{}
	h := newHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: prov, spiller: sp, gate: &fakeGate{}})
	w := post(h, validBody, map[string]string{"X-User-ID": "bob"})
	body := w.Body.String()
	if w.Code != http.StatusOK || w.Header().Get("X-Stream-Path") != protocol.PathQueued {
		t.Fatalf("HTTP %d body %q, want a queued stream", w.Code, body)
	}
	if !strings.Contains(body, `"content":"queued hi"`) || !strings.Contains(body, `"finish_reason":"length","path":"queued"`) {
		t.Errorf("stream %q lacks the relayed chunk or done", body)
	}
	// The header is set with its documented spelling, so read it by key.
	if ids := w.Header()[stream.RequestIDHeader]; len(sp.jobs) != 1 || sp.jobs[0].UserID != "user:bob" || len(ids) != 1 || sp.jobs[0].RequestID != ids[0] {
		t.Errorf("jobs %+v, want one for bob with the response's request id", sp.jobs)
	}
	if completed := <-relay.closed; !completed {
		t.Error("relay closed as incomplete after done")
	}
	if prov.calls != 0 {
		t.Errorf("provider called %d times on the queued path", prov.calls)
	}
}

func TestHandlerRefusals(t *testing.T) {
	t.Parallel()
	keyDigest := sha256.Sum256([]byte("secret"))
	for _, tt := range []struct {
		name     string
		d        deps
		body     string
		hdr      map[string]string
		status   int
		slug     string
		retry    int
		spilled  bool
		poolUsed bool
	}{
		{name: "rate limited before the pool", d: deps{pool: &fakePool{free: 1}, spiller: &fakeSpiller{},
			gate: &fakeGate{admit: protocol.RateLimited(7)}}, status: 429, slug: protocol.ProblemRateLimited, retry: 7},
		{name: "pool full, no queue", d: deps{pool: &fakePool{err: pool.ErrPoolExhausted},
			gate: &fakeGate{retryAfter: 1500 * time.Millisecond}}, status: 503, slug: protocol.ProblemPoolExhausted, retry: 2, poolUsed: true},
		{name: "queue over threshold", d: deps{pool: &fakePool{err: pool.ErrUserLimit}, spiller: &fakeSpiller{},
			gate: &fakeGate{mayQueue: protocol.QueueOverflow(60)}}, status: 503, slug: protocol.ProblemQueueOverflow, retry: 60, poolUsed: true},
		{name: "queue refuses", d: deps{pool: &fakePool{err: pool.ErrPoolExhausted}, spiller: &fakeSpiller{refuse: errors.New("boom")},
			gate: &fakeGate{}}, status: 503, slug: protocol.ProblemQueueUnavailable, retry: 1, spilled: true, poolUsed: true},
		{name: "wrong media type", d: deps{pool: &fakePool{free: 1}, gate: &fakeGate{}},
			hdr: map[string]string{"Content-Type": "text/plain"}, status: 415, slug: protocol.ProblemUnsupportedMedia},
		{name: "body too large", d: deps{pool: &fakePool{free: 1}, gate: &fakeGate{}},
			body: `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, status: 413, slug: protocol.ProblemBodyTooLarge},
		{name: "bad json", d: deps{pool: &fakePool{free: 1}, gate: &fakeGate{}}, body: `{"messages":`, status: 400, slug: protocol.ProblemBadRequest},
		{name: "missing key", d: deps{pool: &fakePool{free: 1}, gate: &fakeGate{}, keys: []string{"secret"}}, status: 401, slug: protocol.ProblemUnauthorized},
		{name: "wrong key", d: deps{pool: &fakePool{free: 1}, gate: &fakeGate{}, keys: []string{hex.EncodeToString(keyDigest[:])}},
			hdr: map[string]string{"Authorization": "Bearer guess"}, status: 401, slug: protocol.ProblemUnauthorized},
		{name: "bad user id", d: deps{pool: &fakePool{free: 1}, gate: &fakeGate{}},
			hdr: map[string]string{"X-User-ID": "no spaces"}, status: 400, slug: protocol.ProblemBadRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.d.provider = &fakeProvider{chunks: []string{"x"}}
			h := newHandler(t, tt.d)
			body := tt.body
			if body == "" {
				body = validBody
			}
			w := post(h, body, tt.hdr)
			p := problemOf(t, w)
			if w.Code != tt.status || p.Slug() != tt.slug || p.RetryAfterSeconds != tt.retry {
				t.Fatalf("HTTP %d %s retry %d, want %d %s retry %d", w.Code, p.Slug(), p.RetryAfterSeconds, tt.status, tt.slug, tt.retry)
			}
			if tt.retry > 0 && w.Header().Get("Retry-After") == "" {
				t.Error("no Retry-After header")
			}
			if sp := tt.d.spiller; sp != nil && (len(sp.jobs) > 0) != tt.spilled {
				t.Errorf("spilled %d jobs, want spilled=%v", len(sp.jobs), tt.spilled)
			}
			if asked, _ := tt.d.pool.state(); (len(asked) > 0) != tt.poolUsed || tt.d.provider.calls != 0 {
				t.Errorf("pool asked %q, provider called %d times; want pool used=%v, provider never", asked, tt.d.provider.calls, tt.poolUsed)
			}
		})
	}
}

// With API keys, the identity is the key's digest with X-User-ID scoped
// under it, and a configured sha256: digest accepts the key it digests.
func TestHandlerAPIKeyIdentity(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("secret"))
	p := &fakePool{free: 1}
	h := newHandler(t, deps{pool: p, provider: &fakeProvider{}, gate: &fakeGate{}, keys: []string{" ", "sha256:" + hex.EncodeToString(sum[:]) + "=high"}})
	w := post(h, validBody, map[string]string{"Authorization": "bearer secret", "X-User-ID": "alice"})
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d %q with the right key", w.Code, w.Body.String())
	}
	if asked, _ := p.state(); len(asked) != 1 || asked[0] != "key:"+hex.EncodeToString(sum[:6])+"/user:alice" {
		t.Errorf("identity %q, want the key's digest with the user under it", asked)
	}
}

// A malformed API_KEYS entry fails New with a message naming no secret.
func TestHandlerRejectsBadKeyEntry(t *testing.T) {
	t.Parallel()
	_, err := stream.New(stream.Config{MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		APIKeys: []string{"sha256:nothex"}}, stream.Deps{Pool: &fakePool{}, Provider: &fakeProvider{}, Log: testutil.DiscardLogger()})
	if err == nil || strings.Contains(err.Error(), "nothex") {
		t.Fatalf("err = %v, want a refusal that does not echo the entry", err)
	}
}

// LLM_MODELS refuses another model with a 400 before any slot or call.
func TestHandlerModelAllowlist(t *testing.T) {
	t.Parallel()
	p := &fakePool{free: 1}
	prov := &fakeProvider{chunks: []string{"x"}}
	h, err := stream.New(stream.Config{MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		DirectPathEnabled: true, Models: []string{"gpt-a", "gpt-b"}},
		stream.Deps{Pool: p, Provider: prov, Gate: &fakeGate{}, Log: testutil.DiscardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	w := post(h, `{"model":"gpt-c","messages":[{"role":"user","content":"hi"}]}`, nil)
	if pr := problemOf(t, w); w.Code != http.StatusBadRequest || pr.Slug() != protocol.ProblemBadRequest {
		t.Fatalf("HTTP %d %+v, want 400 bad-request", w.Code, pr)
	}
	if asked, _ := p.state(); len(asked) != 0 || prov.calls != 0 {
		t.Errorf("pool asked %q, provider called %d times for a refused model", asked, prov.calls)
	}
	if w := post(h, `{"model":"gpt-b","messages":[{"role":"user","content":"hi"}]}`, nil); w.Code != http.StatusOK {
		t.Errorf("allowed model: HTTP %d %q", w.Code, w.Body.String())
	}
}

// Jobs waiting for a worker send a new request to the queue even with a
// free slot, so it does not overtake them.
func TestHandlerQueuesBehindBacklog(t *testing.T) {
	t.Parallel()
	relay := newFakeRelay(protocol.Result{Kind: protocol.KindDone})
	sp := &fakeSpiller{relay: relay}
	p := &fakePool{free: 1}
	h := newHandler(t, deps{pool: p, provider: &fakeProvider{}, spiller: sp, gate: &fakeGate{queueFirst: true}})
	if w := post(h, validBody, nil); w.Header().Get("X-Stream-Path") != protocol.PathQueued {
		t.Fatalf("path %q, want queued behind the backlog", w.Header().Get("X-Stream-Path"))
	}
	if asked, _ := p.state(); len(asked) != 0 {
		t.Errorf("pool asked %q while jobs wait", asked)
	}
}

// A client that leaves a queued stream closes the relay as incomplete, so
// the workers are told.
func TestHandlerClientLeavesQueuedStream(t *testing.T) {
	t.Parallel()
	relay := newFakeRelay()
	h := newHandler(t, deps{pool: &fakePool{err: pool.ErrPoolExhausted}, provider: &fakeProvider{}, spiller: &fakeSpiller{relay: relay}, gate: &fakeGate{}})
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/stream", strings.NewReader(validBody))
	r.Header.Set("Content-Type", "application/json")
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	cancel()
	select {
	case completed := <-relay.closed:
		if completed {
			t.Error("relay closed as completed after the client left")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("relay not closed after the client left")
	}
	<-served
}

// A provider failure on the direct path ends the stream with a
// provider-error event, not a problem response.
func TestHandlerDirectProviderFailure(t *testing.T) {
	t.Parallel()
	h := newHandler(t, deps{pool: &fakePool{free: 1}, gate: &fakeGate{},
		provider: &fakeProvider{chunks: []string{"a"}, err: &llm.Error{Retryable: true, RetryAfter: 3 * time.Second, Err: io.ErrUnexpectedEOF}}})
	w := post(h, validBody, nil)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "event: error") ||
		!strings.Contains(w.Body.String(), `provider-error","title":"Provider Error","status":502`) ||
		!strings.Contains(w.Body.String(), `"retry_after_seconds":3`) {
		t.Fatalf("HTTP %d body %q, want an error event of type provider-error advising 3s", w.Code, w.Body.String())
	}
}
