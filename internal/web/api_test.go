package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/browsertest"
)

// The simulator the embedded api runs in these tests; answers are
// llm.SimChunks of the messages with this seed and length.
const (
	simSeed   = 7
	simTokens = 24
)

// startAPI serves a real api, built by internal/app in embedded mode
// (miniredis, in-process workers, the simulator), on a loopback port.
func startAPI(t *testing.T, env map[string]string) string {
	t.Helper()
	full := map[string]string{
		"SIM_FIRST_TOKEN_MS": "1", "SIM_TOKEN_MS": "2", "SIM_TOKENS": strconv.Itoa(simTokens),
		"SIM_SEED": strconv.Itoa(simSeed), "SHUTDOWN_GRACE_SECONDS": "1",
	}
	for k, v := range env {
		full[k] = v
	}
	cfg, err := config.Load("", full)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := app.NewAPI(cfg, log, app.Options{})
	if err != nil {
		t.Fatalf("NewAPI: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("api did not shut down within 30s")
		}
		a.Close()
	})
	return "http://" + ln.Addr().String()
}

// reference is the simulator's answer to msgs, which the api relays
// unchanged on both paths.
func reference(msgs ...protocol.Message) string {
	return strings.Join(llm.SimChunks(msgs, simSeed, simTokens), "")
}

func user(s string) protocol.Message      { return protocol.Message{Role: "user", Content: s} }
func assistant(s string) protocol.Message { return protocol.Message{Role: "assistant", Content: s} }

// The chat page answers exactly what /v1/stream answers for the same
// messages, on the first turn and on a later one that carries the
// conversation. With SPILLWAY_SCREENSHOT=1 it saves docs/chat-page.png
// while the second answer streams.
func TestChatPageAnswersLikeTheAPI(t *testing.T) {
	t.Parallel()
	shot := os.Getenv("SPILLWAY_SCREENSHOT") == "1"
	env := map[string]string{}
	if shot {
		env["SIM_TOKEN_MS"] = "150" // slow enough to catch the answer mid-stream
	}
	url := startAPI(t, env)
	ctx := openPage(t, url)

	const q1 = "What is a spillway?"
	ask(t, ctx, q1)
	waitState(t, ctx, "done")
	want1 := reference(user(q1))
	if _, text := answer(t, ctx); text != want1 {
		t.Fatalf("first answer %q,\nwant %q", text, want1)
	}
	if got := browsertest.Eval[string](t, ctx, lastTurn+`.querySelector('[data-role="path"]').textContent`); got != "direct" {
		t.Errorf("path shown %q, want direct", got)
	}

	const q2 = "And why does a gateway need one?"
	ask(t, ctx, q2)
	if shot {
		browsertest.Until(t, ctx, lastAnswer+`.textContent.length > 60`, "the second answer under way")
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(900, 640)); err != nil {
			t.Fatal(err)
		}
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("..", "..", "docs", "chat-page.png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot saved to %s", path)
	}
	waitState(t, ctx, "done")
	want2 := reference(user(q1), assistant(want1), user(q2))
	if _, text := answer(t, ctx); text != want2 {
		t.Fatalf("second answer %q,\nwant %q", text, want2)
	}
}

// With the only slot taken the page's request goes through the queue: the
// page shows the queued path while it waits, and the answer is complete.
func TestChatPageQueuedPath(t *testing.T) {
	t.Parallel()
	// Answers take 24 × 300 ms: the holder keeps the slot long enough for
	// the page to ask even on a loaded machine, and the test ends it early.
	url := startAPI(t, map[string]string{"CONNECTION_POOL_SIZE": "1", "SIM_TOKEN_MS": "300"})
	ctx := openPage(t, url)
	// Hold the slot with a stream that runs until the test lets it go.
	holdCtx, release := context.WithCancel(t.Context())
	defer release()
	req, _ := http.NewRequestWithContext(holdCtx, http.MethodPost, url+"/v1/stream",
		strings.NewReader(`{"prompt":"hold the slot"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "holder")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != "direct" {
		t.Fatalf("holder: %d %s", resp.StatusCode, resp.Header.Get("X-Stream-Path"))
	}

	const q = "Am I in the queue?"
	ask(t, ctx, q)
	browsertest.Until(t, ctx, lastTurn+`.querySelector('[data-role="path"]').textContent === "queued"`, "the queued path shown")
	if state, _ := answer(t, ctx); state != "streaming" {
		t.Fatalf("state %q while queued", state)
	}
	release() // the holder leaves; its slot goes to the queued job
	waitState(t, ctx, "done")
	if _, text := answer(t, ctx); text != reference(user(q)) {
		t.Fatalf("queued answer %q, want %q", text, reference(user(q)))
	}
}

// A refusal is shown with its title, detail and Retry-After, and the retry
// button counts the delay down before it can be used.
func TestChatPageShowsRefusal(t *testing.T) {
	t.Parallel()
	url := startAPI(t, map[string]string{"RATE_LIMIT_RPS": "0.1", "RATE_LIMIT_BURST": "1"})
	ctx := openPage(t, url)
	ask(t, ctx, "first")
	waitState(t, ctx, "done")
	ask(t, ctx, "second")
	waitState(t, ctx, "error")
	status := statusText(t, ctx)
	ra := browsertest.Eval[string](t, ctx, lastTurn+`.querySelector('[data-role="status"]').dataset.retryAfter || ""`)
	n, err := strconv.Atoi(ra)
	if err != nil || n < 1 || n > 10 {
		t.Fatalf("Retry-After shown %q, want 1 to 10 s (0.1 requests/s)", ra)
	}
	for _, part := range []string{"Too Many Requests (429)", "too many requests", "Retry after " + ra + " s"} {
		if !strings.Contains(status, part) {
			t.Errorf("status %q lacks %q", status, part)
		}
	}
	btn := browsertest.Eval[[]any](t, ctx, `(() => { const b = `+lastTurn+`.querySelector('[data-role="retry"]'); return [b.disabled, b.textContent] })()`)
	if btn[0] != true || !strings.HasPrefix(btn[1].(string), "Retry in ") {
		t.Errorf("retry button %v, want disabled and counting down", btn)
	}
}

// CHAT_PAGE_ENABLED=false removes the page: GET / is the api's 404 problem.
func TestChatPageCanBeDisabled(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		enabled string
		want    int
	}{{"true", http.StatusOK}, {"false", http.StatusNotFound}} {
		url := startAPI(t, map[string]string{"CHAT_PAGE_ENABLED": tt.enabled})
		resp, err := http.Get(url + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("CHAT_PAGE_ENABLED=%s: GET / is %d, want %d", tt.enabled, resp.StatusCode, tt.want)
		}
	}
}

// The api's refusals of every kind carry the CORS headers for an allowed
// origin and none for another; a preflight is answered 204 instead of the
// 405 it used to get.
func TestAPIRefusalsCarryCORS(t *testing.T) {
	t.Parallel()
	const allowed, other = "https://chat.example.com", "https://other.example"
	url := startAPI(t, map[string]string{"CORS_ALLOWED_ORIGINS": allowed, "RATE_LIMIT_RPS": "0.1", "RATE_LIMIT_BURST": "1"})
	do := func(method, path, origin, body string, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		req.Header.Set("Origin", origin)
		req.Header.Set("X-User-ID", "cors")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	jsonCT := map[string]string{"Content-Type": "application/json"}
	preflight := map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,x-user-id"}
	for _, tt := range []struct {
		name, method, path, body string
		hdr                      map[string]string
		want                     int
	}{
		{"preflight", http.MethodOptions, "/v1/stream", "", preflight, http.StatusNoContent},
		{"stream", http.MethodPost, "/v1/stream", `{"prompt":"hi"}`, jsonCT, http.StatusOK},
		{"rate limited", http.MethodPost, "/v1/stream", `{"prompt":"hi"}`, jsonCT, http.StatusTooManyRequests},
		{"bad media type", http.MethodPost, "/v1/stream", `{}`, nil, http.StatusUnsupportedMediaType},
		{"not found", http.MethodGet, "/nope", "", nil, http.StatusNotFound},
		{"method not allowed", http.MethodPut, "/v1/stream", "", nil, http.StatusMethodNotAllowed},
	} {
		resp := do(tt.method, tt.path, allowed, tt.body, tt.hdr)
		if resp.StatusCode != tt.want || resp.Header.Get("Access-Control-Allow-Origin") != allowed {
			t.Errorf("%s: %d (want %d), Allow-Origin %q", tt.name, resp.StatusCode, tt.want, resp.Header.Get("Access-Control-Allow-Origin"))
		}
		if tt.want == http.StatusTooManyRequests && (resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "Retry-After")) {
			t.Errorf("%s: Retry-After %q not exposed (%q)", tt.name, resp.Header.Get("Retry-After"), resp.Header.Get("Access-Control-Expose-Headers"))
		}
	}
	for _, method := range []string{http.MethodOptions, http.MethodPost} {
		resp := do(method, "/v1/stream", other, `{"prompt":"hi"}`, preflight)
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "" {
			t.Errorf("%s from %s: Allow-Origin %q, want none", method, other, got)
		}
	}
}

// In Chromium, a page on an allowed origin calls the api cross-origin
// (preflight, POST with X-User-ID), reads X-Request-ID and the stream, and
// reads a 429's Retry-After; a page on another origin is refused by the
// browser.
func TestCORSInBrowser(t *testing.T) {
	t.Parallel()
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, `<!doctype html><title>other origin</title><script>
async function call(api) {
  const r = await fetch(api + "/v1/stream", {method: "POST",
    headers: {"Content-Type": "application/json", "X-User-ID": "cross"}, body: JSON.stringify({prompt: "hi"})});
  return {status: r.status, id: r.headers.get("X-Request-ID") || "", path: r.headers.get("X-Stream-Path") || "",
    retryAfter: r.headers.get("Retry-After") || "", body: await r.text()};
}
async function both(api) {
  try { return JSON.stringify([await call(api), await call(api)]); } catch (e) { return "failed: " + e.name; }
}
</script>`)
	}))
	defer page.Close()
	blocked := httptest.NewServer(page.Config.Handler)
	defer blocked.Close()
	url := startAPI(t, map[string]string{"CORS_ALLOWED_ORIGINS": page.URL, "RATE_LIMIT_RPS": "0.1", "RATE_LIMIT_BURST": "1"})

	run := func(origin string) string {
		ctx := browsertest.Tab(t, tabDeadline)
		if err := chromedp.Do(ctx, chromedp.Navigate(origin)); err != nil {
			t.Fatal(err)
		}
		out, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf("both(%q)", url), chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	out := run(page.URL)
	var got []struct {
		Status                     int
		ID, Path, RetryAfter, Body string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 2 {
		t.Fatalf("allowed origin: %s (%v)", out, err)
	}
	if got[0].Status != http.StatusOK || got[0].ID == "" || got[0].Path != "direct" || !strings.Contains(got[0].Body, "event: done") {
		t.Errorf("allowed origin, first call: %+v", got[0])
	}
	if ra, err := strconv.Atoi(got[1].RetryAfter); got[1].Status != http.StatusTooManyRequests || err != nil || ra < 1 || ra > 10 ||
		!strings.Contains(got[1].Body, "rate-limited") {
		t.Errorf("allowed origin, second call: %+v, want a readable 429 with Retry-After", got[1])
	}
	if out := run(blocked.URL); out != "failed: TypeError" {
		t.Errorf("origin not allowed: %s, want the browser to refuse the call (TypeError)", out)
	}
}
