package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/browsertest"
	"github.com/spillway-dev/spillway/internal/web"
)

func TestMain(m *testing.M) { os.Exit(browsertest.Main(m)) }

// tabDeadline bounds everything one browser test does; generous because
// the test machine may be heavily loaded.
const tabDeadline = 90 * time.Second

// JavaScript for the hooks the page promises (package doc).
const (
	lastAnswer = `[...document.querySelectorAll('[data-role="assistant"]')].at(-1)`
	lastTurn   = lastAnswer + `.closest("article")`
)

// The page is served whole, with the hooks, no external assets, and a
// policy that lets only its own inline script and style run.
func TestHandlerServesSelfContainedPage(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(web.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	page := string(body)
	for _, hook := range []string{`<form id="chat-form"`, `<textarea id="prompt"`, `type="submit"`, `"assistant"`, `"streaming"`} {
		if !strings.Contains(page, hook) {
			t.Errorf("page lacks %s", hook)
		}
	}
	for _, external := range []string{"<link", " src=", "@import", "url(", "http://", "https://", "innerHTML"} {
		if strings.Contains(page, external) {
			t.Errorf("page contains %q: it must be self-contained and never parse server text as markup", external)
		}
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if strings.Count(csp, "'sha256-") != 2 || !strings.Contains(csp, "connect-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q: want the inline script and style by hash only", csp)
	}
}

// fakeAPI serves the page and lets each test script the api endpoints it
// talks to.
func fakeAPI(t *testing.T, mux *http.ServeMux) string {
	t.Helper()
	mux.Handle("GET /{$}", web.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// openPage navigates a new tab to url and waits for the page's script.
func openPage(t *testing.T, url string) (ctx context.Context) {
	t.Helper()
	ctx = browsertest.Tab(t, tabDeadline)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("navigate %s: %v", url, err)
	}
	browsertest.Until(t, ctx, `document.activeElement && document.activeElement.id === "prompt"`, "the page to start")
	return ctx
}

// ask types text into the prompt and submits the form with its button.
func ask(t *testing.T, ctx context.Context, text string) {
	t.Helper()
	before := browsertest.Eval[int](t, ctx, `document.querySelectorAll('[data-role="assistant"]').length`)
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("textarea#prompt"), text),
		chromedp.Click(chromedp.CSS(`#chat-form button[type="submit"]`)),
	); err != nil {
		t.Fatalf("ask %q: %v", text, err)
	}
	browsertest.Until(t, ctx, fmt.Sprintf(`document.querySelectorAll('[data-role="assistant"]').length === %d`, before+1), "a new answer element")
}

// answer is the last answer's state and text.
func answer(t *testing.T, ctx context.Context) (state, text string) {
	t.Helper()
	v := browsertest.Eval[[]string](t, ctx, `[`+lastAnswer+`.dataset.state, `+lastAnswer+`.textContent]`)
	return v[0], v[1]
}

// waitState waits until the last answer's data-state is want.
func waitState(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	browsertest.Until(t, ctx, lastAnswer+`.dataset.state === `+jsString(want), "the answer to be "+want)
}

// statusText is the last turn's visible status line.
func statusText(t *testing.T, ctx context.Context) string {
	t.Helper()
	return browsertest.Eval[string](t, ctx, lastTurn+`.querySelector('[data-role="status"]').textContent`)
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// sse writes raw wire text and flushes it, so the browser sees it as its
// own read.
func sse(w http.ResponseWriter, raw string) {
	_, _ = io.WriteString(w, raw)
	http.NewResponseController(w).Flush()
}

func startSSE(w http.ResponseWriter, id, path string) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Request-ID", id)
	h.Set("X-Stream-Path", path)
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
}

func decodeMessages(t *testing.T, r *http.Request) []protocol.Message {
	t.Helper()
	var body struct {
		Messages []protocol.Message `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		t.Errorf("request body: %v", err)
	}
	return body.Messages
}

// Every event of the wire format, written in the ways a server may write
// it (CRLF, CR alone, a CRLF split across reads, multi-line data,
// comments), is rendered; queued, retrying and reset are shown while they
// apply; server text stays text; the next turn carries the conversation.
func TestPageRendersEveryEvent(t *testing.T) {
	t.Parallel()
	step := make(chan struct{})
	bodies := make(chan []protocol.Message, 2)
	mux := http.NewServeMux()
	var calls int
	var mu sync.Mutex
	mux.HandleFunc("POST /v1/stream", func(w http.ResponseWriter, r *http.Request) {
		bodies <- decodeMessages(t, r)
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		wait := func() {
			select {
			case <-step:
			case <-r.Context().Done():
			}
		}
		if n > 1 {
			startSSE(w, "req-2", "direct")
			sse(w, "id: 1\ndata: {\"content\":\"Second.\"}\n\nevent: done\nid: 2\ndata: {\"path\":\"direct\"}\n\n")
			return
		}
		startSSE(w, "req-1", "queued")
		sse(w, ": ping\r\n\r\nevent: queued\r\nid: 1\r\ndata: {\"position\":3,\"eta_seconds\":4}\r\n\r\n")
		wait()
		sse(w, "id: 2\r")
		sse(w, "\ndata: {\"content\":\"Hel\"}\r\n\r\n")
		sse(w, "event: retrying\nid: 3\ndata: {\"attempt\":2,\"retry_in_seconds\":1,\"reason\":\"upstream 503\"}\n\n")
		wait()
		sse(w, "event: reset\rid: 4\rdata: {\"attempt\":2}\r\r")
		wait()
		sse(w, "id: 5\ndata: {\"content\":\ndata: \"Hello\"}\n\n: ping\n\nevent: unknown-kind\nid: 6\ndata: {}\n\n")
		sse(w, "id: 7\ndata: {\"content\":\", <b>world</b> & \\\"you\\\"\"}\n\n")
		sse(w, "event: done\nid: 8\ndata: {\"request_id\":\"req-1\",\"finish_reason\":\"stop\",\"path\":\"queued\",\"usage\":{\"completion_tokens\":2}}\n\n")
	})
	ctx := openPage(t, fakeAPI(t, mux))
	ask(t, ctx, "hi")
	if got := <-bodies; !slices.Equal(got, []protocol.Message{{Role: "user", Content: "hi"}}) {
		t.Fatalf("first request messages %+v, want exactly one user message", got)
	}

	browsertest.Until(t, ctx, lastTurn+`.textContent.includes("position 3, about 4 s")`, "the queue position")
	if state, _ := answer(t, ctx); state != "streaming" {
		t.Fatalf("state %q while queued", state)
	}
	if got := browsertest.Eval[string](t, ctx, lastTurn+`.querySelector('[data-role="path"]').textContent`); got != "queued" {
		t.Fatalf("path shown %q, want queued", got)
	}
	step <- struct{}{}
	browsertest.Until(t, ctx, lastTurn+`.textContent.includes("retry 2 in 1 s (upstream 503)")`, "the retry notice")
	if _, text := answer(t, ctx); text != "Hel" {
		t.Fatalf("text %q before the reset, want Hel", text)
	}
	step <- struct{}{}
	browsertest.Until(t, ctx, lastTurn+`.textContent.includes("restarted")`, "the reset notice")
	if _, text := answer(t, ctx); text != "" {
		t.Fatalf("text %q after the reset, want it cleared", text)
	}
	step <- struct{}{}
	waitState(t, ctx, "done")
	const want = `Hello, <b>world</b> & "you"`
	if _, text := answer(t, ctx); text != want {
		t.Fatalf("text %q, want %q", text, want)
	}
	if n := browsertest.Eval[int](t, ctx, `document.querySelectorAll("#log b").length`); n != 0 {
		t.Fatalf("server text became markup: %d <b> elements", n)
	}
	if s := statusText(t, ctx); !strings.Contains(s, "restarted") {
		t.Errorf("status %q: the reset note should stay after done", s)
	}

	ask(t, ctx, "more")
	want2 := []protocol.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: want}, {Role: "user", Content: "more"}}
	if got := <-bodies; !slices.Equal(got, want2) {
		t.Fatalf("second request messages %+v, want %+v", got, want2)
	}
	waitState(t, ctx, "done")

	// A new conversation starts again from one user message.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("new-chat"))); err != nil {
		t.Fatal(err)
	}
	ask(t, ctx, "fresh")
	if got := <-bodies; !slices.Equal(got, []protocol.Message{{Role: "user", Content: "fresh"}}) {
		t.Fatalf("after New conversation: messages %+v", got)
	}
	waitState(t, ctx, "done")
}

// A connection dropped mid-answer is resumed with GET /v1/streams/{id} and
// Last-Event-ID, retried after a failed attempt, with the same credentials;
// an event sent again after the resume is not appended twice.
func TestPageResumesAfterDroppedConnection(t *testing.T) {
	t.Parallel()
	type get struct{ lastID, user, auth string }
	var mu sync.Mutex
	var gets []get
	var postUser, postAuth string
	drop := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/stream", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		postUser, postAuth = r.Header.Get("X-User-ID"), r.Header.Get("Authorization")
		mu.Unlock()
		startSSE(w, "req/7", "direct")
		sse(w, "id: 1\ndata: {\"content\":\"A\"}\n\nid: 2\ndata: {\"content\":\"B\"}\n\n")
		<-drop                      // the page has shown both
		panic(http.ErrAbortHandler) // the connection breaks without a terminal event
	})
	mux.HandleFunc("GET /v1/streams/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "req/7" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		gets = append(gets, get{r.Header.Get("Last-Event-ID"), r.Header.Get("X-User-ID"), r.Header.Get("Authorization")})
		n := len(gets)
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		// It sends event 2 again, which the page must skip, then the rest.
		startSSE(w, "req/7", "direct")
		sse(w, "id: 2\ndata: {\"content\":\"B\"}\n\nid: 3\ndata: {\"content\":\"C\"}\n\nevent: done\nid: 4\ndata: {\"path\":\"direct\"}\n\n")
	})
	ctx := openPage(t, fakeAPI(t, mux))
	if err := chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS("details.settings summary")),
		chromedp.SendKeys(chromedp.ID("api-key"), "k1"),
		chromedp.SendKeys(chromedp.ID("user-id"), "alice"),
	); err != nil {
		t.Fatal(err)
	}
	ask(t, ctx, "tell me")
	browsertest.Until(t, ctx, lastAnswer+`.textContent === "AB"`, "the first two chunks")
	close(drop)
	waitState(t, ctx, "done")
	if _, text := answer(t, ctx); text != "ABC" {
		t.Fatalf("text %q, want ABC", text)
	}
	mu.Lock()
	defer mu.Unlock()
	want := get{"2", "alice", "Bearer k1"}
	if len(gets) != 2 || gets[0] != want || gets[1] != want || postUser != "alice" || postAuth != "Bearer k1" {
		t.Fatalf("resumes %+v (want 2 of %+v), POST user %q auth %q", gets, want, postUser, postAuth)
	}
	// The settings are kept for the next visit.
	if got := browsertest.Eval[string](t, ctx, `localStorage.getItem("spillway.userId")`); got != "alice" {
		t.Errorf("stored user id %q", got)
	}
}

// Stop ends the connection at once and tells the server to stop with
// DELETE /v1/streams/{id}; nothing is resumed afterwards.
func TestPageStopSendsDelete(t *testing.T) {
	t.Parallel()
	deleted := make(chan string, 1)
	closed := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/stream", func(w http.ResponseWriter, r *http.Request) {
		startSSE(w, "req-9", "direct")
		sse(w, "id: 1\ndata: {\"content\":\"partial\"}\n\n")
		<-r.Context().Done()
		close(closed)
	})
	mux.HandleFunc("DELETE /v1/streams/{id}", func(w http.ResponseWriter, r *http.Request) {
		deleted <- r.PathValue("id")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/streams/{id}", func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("resumed after stop: GET %s", r.URL)
		w.WriteHeader(http.StatusNotFound)
	})
	ctx := openPage(t, fakeAPI(t, mux))
	ask(t, ctx, "long answer please")
	browsertest.Until(t, ctx, lastAnswer+`.textContent === "partial"`, "the first chunk")
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("stop"))); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, "error")
	select {
	case id := <-deleted:
		if id != "req-9" {
			t.Fatalf("DELETE for %q, want req-9", id)
		}
	case <-time.After(tabDeadline):
		t.Fatal("no DELETE after Stop")
	}
	select {
	case <-closed:
	case <-time.After(tabDeadline):
		t.Fatal("the stream's connection stayed open after Stop")
	}
	if s := statusText(t, ctx); s != "Stopped." {
		t.Errorf("status %q, want Stopped.", s)
	}
	if n := browsertest.Eval[int](t, ctx, lastTurn+`.querySelectorAll('[data-role="retry"]').length`); n != 1 {
		t.Errorf("%d retry buttons after Stop, want 1", n)
	}
}

// A reasoning model's thinking is shown as it streams, in a collapsed
// block apart from the answer, which holds the content alone.
func TestPageShowsReasoningCollapsed(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/stream", func(w http.ResponseWriter, r *http.Request) {
		_ = decodeMessages(t, r)
		startSSE(w, "req-r", "direct")
		sse(w, "id: 1\ndata: {\"content\":\"\",\"reasoning\":\"Two and two\"}\n\n")
		sse(w, "id: 2\ndata: {\"content\":\"\",\"reasoning\":\" make four.\"}\n\n")
		sse(w, "id: 3\ndata: {\"content\":\"4\"}\n\n")
		sse(w, "event: done\nid: 4\ndata: {\"request_id\":\"req-r\",\"finish_reason\":\"stop\",\"path\":\"direct\"}\n\n")
	})
	ctx := openPage(t, fakeAPI(t, mux))
	ask(t, ctx, "2+2?")
	waitState(t, ctx, "done")
	if _, text := answer(t, ctx); text != "4" {
		t.Fatalf("answer %q, want the content alone", text)
	}
	got := browsertest.Eval[string](t, ctx, lastTurn+`.querySelector('[data-role="reasoning"] div').textContent`)
	open := browsertest.Eval[bool](t, ctx, lastTurn+`.querySelector('[data-role="reasoning"]').open`)
	if got != "Two and two make four." || open {
		t.Fatalf("reasoning %q (open %v), want it whole and collapsed", got, open)
	}
}
