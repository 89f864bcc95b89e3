package models

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// mockUpstream is a real HTTP upstream whose GET /v1/models answers body
// with status, counting the calls and the bearer tokens it saw.
type mockUpstream struct {
	srv    *httptest.Server
	calls  atomic.Int64
	mu     sync.Mutex
	auth   []string
	status int
	body   string
}

func newMock(tb testing.TB, status int, body string) *mockUpstream {
	tb.Helper()
	m := &mockUpstream{status: status, body: body}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		m.calls.Add(1)
		m.mu.Lock()
		m.auth = append(m.auth, r.Header.Get("Authorization"))
		m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(m.status)
		_, _ = w.Write([]byte(m.body))
	}))
	tb.Cleanup(m.srv.Close)
	return m
}

func (m *mockUpstream) spec(name, key string) upstream.Spec {
	return upstream.Spec{Name: name, BaseURL: m.srv.URL + "/v1", APIKey: key}
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newCatalog(tb testing.TB, cfg Config, log *slog.Logger) *Catalog {
	tb.Helper()
	c, err := New(cfg, log)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func get(tb testing.TB, c *Catalog, id string) (int, string) {
	tb.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	if id == "" {
		c.ServeList(w, r)
	} else {
		c.ServeModel(w, r, id)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		tb.Fatalf("Content-Type %q", ct)
	}
	return w.Code, w.Body.String()
}

// listIDs decodes a list body into its ids, checking its shape.
func listIDs(tb testing.TB, body string) ([]string, []json.RawMessage) {
	tb.Helper()
	var l struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &l); err != nil || l.Object != "list" {
		tb.Fatalf("list %q: %v", body, err)
	}
	ids := make([]string, len(l.Data))
	for i, raw := range l.Data {
		var o struct{ ID string }
		if err := json.Unmarshal(raw, &o); err != nil {
			tb.Fatal(err)
		}
		ids[i] = o.ID
	}
	return ids, l.Data
}

const (
	// a's objects carry fields Spillway knows nothing of, in a's spacing.
	objA1 = `{"id":"gpt-4o","object":"model","created":1715367049,"owned_by":"system","permission":[{"allow_sampling":true}],"max_model_len":128000}`
	objA2 = `{ "id": "shared", "object": "model", "created": 1, "owned_by": "a" }`
	objB1 = `{"id":"shared","object":"model","created":2,"owned_by":"b"}`
	objB2 = `{"id":"meta-llama/Llama-3.1-8B","object":"model","created":3,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B","parent":null}`
)

// The list is the union of the upstreams' lists in configured order, each
// object byte for byte as its upstream sent it (unknown fields too), the
// first upstream winning a duplicate id, then the always-listed models no
// upstream lists, with an object of Spillway's; each upstream gets its own
// key.
func TestUnionPassesObjectsThrough(t *testing.T) {
	t.Parallel()
	a := newMock(t, http.StatusOK, `{"object":"list","data":[`+objA1+`,`+objA2+`]}`)
	b := newMock(t, http.StatusOK, `{"object":"list","data":[`+objB1+`,`+objB2+`,{"object":"model"},42]}`)
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	c := newCatalog(t, Config{
		Upstreams: []upstream.Spec{a.spec("a", "key-a"), b.spec("b", "")},
		Always:    []string{"gpt-4o", "house-model"}, TTL: time.Minute, Now: clk.now,
	}, nil)
	code, body := get(t, c, "")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	want := `{"object":"list","data":[` + objA1 + `,` + objA2 + `,` + objB2 +
		`,{"id":"house-model","object":"model","created":1800000000,"owned_by":"spillway"}]}` + "\n"
	if body != want {
		t.Fatalf("list\n %s\nwant\n %s", body, want)
	}
	if a.auth[0] != "Bearer key-a" || b.auth[0] != "" {
		t.Fatalf("authorization a %q, b %q", a.auth, b.auth)
	}
}

// A burst of requests makes one call per upstream; the list is served
// from the cache until the TTL has passed, then one more call each.
func TestCacheOneCallPerUpstreamPerTTL(t *testing.T) {
	t.Parallel()
	a := newMock(t, http.StatusOK, `{"data":[`+objA1+`]}`)
	b := newMock(t, http.StatusOK, `{"data":[`+objB2+`]}`)
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	c := newCatalog(t, Config{Upstreams: []upstream.Spec{a.spec("a", ""), b.spec("b", "")}, TTL: time.Minute, Now: clk.now}, nil)

	var wg sync.WaitGroup
	bodies := make([]string, 64)
	for i := range bodies {
		wg.Go(func() { _, bodies[i] = get(t, c, "") })
	}
	wg.Wait()
	for _, body := range bodies {
		if ids, _ := listIDs(t, body); len(ids) != 2 {
			t.Fatalf("burst answer %s", body)
		}
	}
	if a.calls.Load() != 1 || b.calls.Load() != 1 {
		t.Fatalf("a burst of %d made %d and %d calls, want 1 each", len(bodies), a.calls.Load(), b.calls.Load())
	}
	clk.add(59 * time.Second)
	get(t, c, "gpt-4o")
	if a.calls.Load() != 1 {
		t.Fatalf("within the TTL: %d calls", a.calls.Load())
	}
	clk.add(time.Second)
	get(t, c, "")
	get(t, c, "")
	if a.calls.Load() != 2 || b.calls.Load() != 2 {
		t.Fatalf("after the TTL: %d and %d calls, want 2 each", a.calls.Load(), b.calls.Load())
	}
}

// TTL 0 asks the upstreams on every request.
func TestNoCache(t *testing.T) {
	t.Parallel()
	a := newMock(t, http.StatusOK, `{"data":[`+objA1+`]}`)
	c := newCatalog(t, Config{Upstreams: []upstream.Spec{a.spec("a", "")}}, nil)
	for range 3 {
		get(t, c, "")
	}
	if a.calls.Load() != 3 {
		t.Fatalf("%d calls, want 3", a.calls.Load())
	}
}

// An upstream whose list fails (an error status, a body that is not a
// list, no answer at all) is logged and left out; the others are listed,
// and so is every always-listed model.
func TestFailingUpstreamLeftOut(t *testing.T) {
	t.Parallel()
	ok := newMock(t, http.StatusOK, `{"data":[`+objB2+`]}`)
	broken := newMock(t, http.StatusInternalServerError, `{"error":{"message":"boom"}}`)
	garbage := newMock(t, http.StatusOK, `<html>`)
	gone := newMock(t, http.StatusOK, `{"data":[`+objA1+`]}`)
	gone.srv.Close()
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	c := newCatalog(t, Config{
		Upstreams: []upstream.Spec{broken.spec("broken", ""), garbage.spec("garbage", ""), gone.spec("gone", ""), ok.spec("ok", "")},
		Always:    []string{"fallback"}, TTL: time.Minute,
	}, log)
	_, body := get(t, c, "")
	ids, _ := listIDs(t, body)
	if strings.Join(ids, ",") != "meta-llama/Llama-3.1-8B,fallback" {
		t.Fatalf("ids %v", ids)
	}
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	for _, name := range []string{"upstream=broken", "status 500", "upstream=garbage", "not a model list", "upstream=gone"} {
		if !strings.Contains(out, name) {
			t.Errorf("log lacks %q:\n%s", name, out)
		}
	}
	if strings.Contains(out, "upstream=ok") {
		t.Errorf("log names the healthy upstream:\n%s", out)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// GET /v1/models/{id} answers the listed object as listed (an id with a
// slash too), or OpenAI's 404 with code model_not_found.
func TestModelFoundAndNotFound(t *testing.T) {
	t.Parallel()
	b := newMock(t, http.StatusOK, `{"data":[`+objB1+`,`+objB2+`]}`)
	c := newCatalog(t, Config{Upstreams: []upstream.Spec{b.spec("b", "")}, Always: []string{"sim"}, TTL: time.Minute}, nil)
	for id, want := range map[string]string{"meta-llama/Llama-3.1-8B": objB2, "shared": objB1} {
		if code, body := get(t, c, id); code != http.StatusOK || body != want+"\n" {
			t.Fatalf("%s: %d %s", id, code, body)
		}
	}
	if code, body := get(t, c, "sim"); code != http.StatusOK || !strings.Contains(body, `"owned_by":"spillway"`) {
		t.Fatalf("sim: %d %s", code, body)
	}
	code, body := get(t, c, "gpt-9")
	want := `{"error":{"message":"The model 'gpt-9' does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}` + "\n"
	if code != http.StatusNotFound || body != want {
		t.Fatalf("unknown: %d %s", code, body)
	}
}

// With an allow-list only its ids are listed, in its order, each with its
// upstream's object when one lists it.
func TestAllowList(t *testing.T) {
	t.Parallel()
	a := newMock(t, http.StatusOK, `{"data":[`+objA1+`,`+objA2+`]}`)
	c := newCatalog(t, Config{Upstreams: []upstream.Spec{a.spec("a", "")}, Always: []string{"house"},
		Allow: []string{"shared", "not-listed", "shared"}, TTL: time.Minute}, nil)
	_, body := get(t, c, "")
	ids, objs := listIDs(t, body)
	if strings.Join(ids, ",") != "shared,not-listed" || string(objs[0]) != objA2 {
		t.Fatalf("list %s", body)
	}
	if code, _ := get(t, c, "gpt-4o"); code != http.StatusNotFound {
		t.Fatalf("a model outside the allow-list: %d", code)
	}
}

// An upstream configured with `models:` is sent only those, so only those
// of its own list are listed; the configured ones it does not list still
// are, as always-listed.
func TestUpstreamModelsFilter(t *testing.T) {
	t.Parallel()
	a := newMock(t, http.StatusOK, `{"data":[`+objA1+`,`+objA2+`]}`)
	spec := a.spec("a", "")
	spec.Models = []string{"shared", "configured-only"}
	c := newCatalog(t, Config{Upstreams: []upstream.Spec{spec}, Always: spec.Models, TTL: time.Minute}, nil)
	_, body := get(t, c, "")
	ids, objs := listIDs(t, body)
	if strings.Join(ids, ",") != "shared,configured-only" || string(objs[0]) != objA2 {
		t.Fatalf("list %s", body)
	}
}

// Without upstreams (the simulator) the always-listed models are the list.
func TestSimulatorOnly(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Unix(42, 0)}
	c := newCatalog(t, Config{Always: []string{"sim"}, TTL: time.Minute, Now: clk.now}, nil)
	if _, body := get(t, c, ""); body != `{"object":"list","data":[{"id":"sim","object":"model","created":42,"owned_by":"spillway"}]}`+"\n" {
		t.Fatalf("list %s", body)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]Config{
		"negative ttl":     {TTL: -time.Second},
		"negative timeout": {Timeout: -time.Second},
		"no base url":      {Upstreams: []upstream.Spec{{Name: "x"}}},
		"empty id":         {Always: []string{""}},
	} {
		if _, err := New(cfg, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(Config{TTL: DefaultTTL}, nil); err != nil {
		t.Fatal(err)
	}
}

// A negative TTL is a *bounds.Error naming it; 0 (ask every time) passes.
func TestConfigTTLBounds(t *testing.T) {
	t.Parallel()
	if err := (Config{TTL: 0}).Validate(); err != nil {
		t.Errorf("TTL 0: %v", err)
	}
	if err := (Config{TTL: -time.Second}).Validate(); !testutil.HasBound(err, "TTL") {
		t.Errorf("TTL -1s: Validate() = %v, want a bounds error for TTL", err)
	}
}
