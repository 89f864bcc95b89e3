package app

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func fastSim() llm.SimConfig {
	return llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond, Tokens: 24, Seed: 7}
}

func directEnv(upstream string, extra map[string]string) map[string]string {
	env := map[string]string{
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": upstream,
		"CONNECTION_POOL_SIZE": "4", "CONNECTION_POOL_PER_USER": "2",
		"SHUTDOWN_GRACE_SECONDS": "1",
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// The direct path relays the upstream's answer exactly, over real HTTP
// against simllm.
func TestDirectStreamEqualsSimulatorText(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, fastSim())
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, nil)))

	for i, text := range []string{"Hello", "Tell me about spillways", "naïve café ☕"} {
		resp := postStream(t, t.Context(), url, prompt(text), map[string]string{"X-User-ID": "u1"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if resp.Header.Get("X-Stream-Path") != protocol.PathDirect || resp.Header.Get("X-Request-ID") == "" {
			t.Fatalf("headers %v", resp.Header)
		}
		want := llm.SimChunks(userMsgs(text), 7, 24)
		rep := loadtest.StreamCheck{Want: want}.Check(resp.Body)
		resp.Body.Close()
		if rep.Lost || rep.Terminal != protocol.EventDone {
			t.Fatalf("prompt %d: lost=%v reason=%s detail=%s terminal=%q", i, rep.Lost, rep.Reason, rep.Detail, rep.Terminal)
		}
		if rep.Done.Usage == nil || rep.Done.Usage.CompletionTokens != 24 || rep.Done.FinishReason != "stop" ||
			rep.Done.Path != protocol.PathDirect || rep.Done.RequestID != resp.Header.Get("X-Request-ID") {
			t.Fatalf("done %+v usage %+v", rep.Done, rep.Done.Usage)
		}
	}
}

// A full pool and a full per-user quota are refused with 503 problem+json
// and Retry-After while no queue is configured.
func TestDirectLimitsRefuse(t *testing.T) {
	t.Parallel()
	slow := fastSim()
	slow.TokenInterval = time.Hour // streams stay open until cancelled
	_, upstream := startSimllm(t, slow)
	a, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{
		"CONNECTION_POOL_SIZE": "2", "CONNECTION_POOL_PER_USER": "1", "QUEUE_FAILOVER_ENABLED": "false",
	})))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	open := postStream(t, ctx, url, prompt("a"), map[string]string{"X-User-ID": "alice"})
	defer open.Body.Close()
	if open.StatusCode != http.StatusOK {
		t.Fatalf("first: %d", open.StatusCode)
	}
	// Per-user limit: alice already holds her one slot.
	p := readProblem(t, postStream(t, t.Context(), url, prompt("b"), map[string]string{"X-User-ID": "alice"}))
	if p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemPoolExhausted || p.RetryAfterSeconds < 1 {
		t.Fatalf("user limit problem %+v", p)
	}
	second := postStream(t, ctx, url, prompt("c"), map[string]string{"X-User-ID": "bob"})
	defer second.Body.Close()
	if second.StatusCode != http.StatusOK {
		t.Fatalf("bob: %d", second.StatusCode)
	}
	resp := postStream(t, t.Context(), url, prompt("d"), map[string]string{"X-User-ID": "carol"})
	if ra := resp.Header.Get("Retry-After"); ra == "" {
		t.Fatal("no Retry-After on a full pool")
	}
	if p := readProblem(t, resp); p.Status != http.StatusServiceUnavailable {
		t.Fatalf("global limit problem %+v", p)
	}
	if st := a.pool.Stats(); st.InUse != 2 {
		t.Fatalf("in use %d, want 2", st.InUse)
	}
}

// A client that leaves mid-stream cancels the upstream call (simllm sees
// it) and frees the slot within a second.
func TestDirectDisconnectCancelsUpstreamAndFreesSlot(t *testing.T) {
	t.Parallel()
	slow := fastSim()
	slow.TokenInterval = 50 * time.Millisecond
	slow.Tokens = 1000
	sim, upstream := startSimllm(t, slow)
	// Without a resume window a disconnect cancels at once.
	a, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{"STREAM_RESUME_WINDOW_SECONDS": "0"})))

	ctx, cancel := context.WithCancel(t.Context())
	resp := postStream(t, ctx, url, prompt("long answer"), nil)
	rep := loadtest.StreamCheck{StopAfter: 2}.Check(resp.Body)
	if !rep.Stopped || rep.Chunks != 2 {
		t.Fatalf("did not get 2 chunks: %+v", rep)
	}
	if a.pool.Stats().InUse != 1 || sim.Active() != 1 {
		t.Fatalf("in use %d, upstream active %d", a.pool.Stats().InUse, sim.Active())
	}
	left := time.Now()
	cancel()
	resp.Body.Close()
	testutil.Eventually(t, time.Second, func() bool { return sim.Cancelled() == 1 && a.pool.Stats().InUse == 0 },
		"upstream cancelled and slot freed")
	t.Logf("upstream cancelled and slot freed %v after disconnect", time.Since(left))
}

// An upstream failure mid-stream ends the stream with one error event that
// leaks no internal text.
func TestDirectUpstreamErrorMidStream(t *testing.T) {
	t.Parallel()
	failing := fastSim()
	failing.FailMidstreamRate = 1
	_, upstream := startSimllm(t, failing)
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, nil)))

	resp := postStream(t, t.Context(), url, prompt("fail please"), nil)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	rep := loadtest.StreamCheck{Want: nil}.Check(strings.NewReader(string(body)))
	if rep.Lost || rep.Terminal != protocol.EventError || rep.Chunks == 0 {
		t.Fatalf("report %+v", rep)
	}
	if rep.Problem.Slug() != protocol.ProblemProviderError || rep.Problem.Status != http.StatusBadGateway {
		t.Fatalf("problem %+v", rep.Problem)
	}
	for _, leak := range []string{"llm:", "status", "127.0.0.1", "retryable", "simulated"} {
		if strings.Contains(strings.ToLower(rep.Problem.Detail), leak) {
			t.Fatalf("problem detail leaks %q: %q", leak, rep.Problem.Detail)
		}
	}
}

// Every bad input is a 4xx problem document, never a 5xx.
func TestBadInputIsProblem4xx(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, fastSim())
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{
		"MAX_BODY_BYTES": "2048", "MAX_TOKENS_LIMIT": "100", "MAX_MESSAGES": "3",
	})))
	cases := []struct {
		name   string
		body   string
		ctype  string
		hdr    map[string]string
		status int
	}{
		{"malformed JSON", `{"messages":[`, "", nil, 400},
		{"not an object", `["hello"]`, "", nil, 400},
		{"messages wrong type", `{"messages":"hello"}`, "", nil, 400},
		{"content wrong type", `{"messages":[{"role":"user","content":5}]}`, "", nil, 400},
		{"empty messages", `{"messages":[]}`, "", nil, 400},
		{"missing messages", `{"model":"sim-1"}`, "", nil, 400},
		{"unknown role", `{"messages":[{"role":"wizard","content":"hi"}]}`, "", nil, 400},
		{"unknown role", `{"messages":[{"role":"robot","content":"x"}]}`, "", nil, 400},
		{"n over MAX_CHOICES", `{"messages":[{"role":"user","content":"x"}],"n":9}`, "", nil, 400},
		{"nested too deep", `{"messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, "", nil, 400},
		{"too many messages", `{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"},{"role":"user","content":"d"}]}`, "", nil, 400},
		{"huge max_tokens", `{"prompt":"hi","max_tokens":1000000}`, "", nil, 400},
		{"max_tokens string", `{"prompt":"hi","max_tokens":"5"}`, "", nil, 400},
		{"temperature too high", `{"prompt":"hi","temperature":2.5}`, "", nil, 400},
		{"prompt and messages", `{"prompt":"hi","messages":[{"role":"user","content":"hi"}]}`, "", nil, 400},
		{"NUL in content", `{"prompt":"a\u0000b"}`, "", nil, 400},
		{"invalid UTF-8", "{\"prompt\":\"\xff\"}", "", nil, 400},
		{"body too large", `{"prompt":"` + strings.Repeat("x", 3000) + `"}`, "", nil, 413},
		{"wrong content type", `{"prompt":"hi"}`, "text/plain", nil, 415},
		{"no content type", `{"prompt":"hi"}`, "-", nil, 415},
		{"bad X-User-ID", `{"prompt":"hi"}`, "", map[string]string{"X-User-ID": "bad id/with space"}, 400},
		{"too long X-User-ID", `{"prompt":"hi"}`, "", map[string]string{"X-User-ID": strings.Repeat("a", 129)}, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/stream", strings.NewReader(tc.body))
			switch tc.ctype {
			case "":
				req.Header.Set("Content-Type", "application/json")
			case "-":
			default:
				req.Header.Set("Content-Type", tc.ctype)
			}
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			readProblem(t, resp)
		})
	}
}

// 404 and 405 are problem documents too; /healthz and /metrics answer.
func TestRoutesAndMetrics(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, fastSim())
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, nil)))
	resp, err := http.Get(url + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	if p := readProblem(t, resp); p.Status != http.StatusNotFound {
		t.Fatalf("%+v", p)
	}
	resp, err = http.Get(url + "/v1/stream")
	if err != nil {
		t.Fatal(err)
	}
	if p := readProblem(t, resp); p.Status != http.StatusMethodNotAllowed {
		t.Fatalf("%+v", p)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	// One stream so the histogram has a sample.
	s := postStream(t, t.Context(), url, prompt("metrics"), nil)
	loadtest.StreamCheck{Want: nil}.Check(s.Body)
	s.Body.Close()
	resp, err = http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range metrics.DocumentedNames {
		if !strings.Contains(string(body), "\n"+name) && !strings.Contains(string(body), "# TYPE "+name+" ") {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if v := scrape(t, url+"/metrics", `spillway_streams_total{outcome="done",path="direct"}`); v != 1 {
		t.Errorf("streams done %v, want 1", v)
	}
}

// On shutdown, streams that finish within the grace period end normally;
// the rest get an error event of type shutting-down; new connections are
// refused; Serve returns. Both streams have relayed a chunk before the
// shutdown begins, so both are cut mid-way or finish from mid-way, never
// before their upstream answered: on two loaded cores under the race
// detector the long stream's first chunk took over a second, and the
// shutdown met it with no chunk (4 of 10 runs). The short stream's grace
// is 30 s, which costs nothing when it ends in its 200 ms and leaves a
// loaded machine room to finish it.
func TestGracefulShutdownWithOpenStreams(t *testing.T) {
	t.Parallel()
	sc := fastSim()
	sc.TokenInterval = 20 * time.Millisecond
	sc.Tokens = 10 // ~200ms: finishes inside the grace period
	_, quick := startSimllm(t, sc)
	sc.Tokens = 100000 // never finishes
	_, endless := startSimllm(t, sc)

	cfgQuick := testConfig(t, directEnv(quick, map[string]string{"SHUTDOWN_GRACE_SECONDS": "30"}))
	_, url, stop := startAPI(t, cfgQuick)
	const grace = time.Second
	cfgEndless := testConfig(t, directEnv(endless, map[string]string{"SHUTDOWN_GRACE_SECONDS": "1"}))
	_, url2, stop2 := startAPI(t, cfgEndless)

	short := postStream(t, t.Context(), url, prompt("short"), nil)
	long := postStream(t, t.Context(), url2, prompt("long"), nil)
	// Each stream's first chunk, read through a copy that the full check
	// reads again from the start.
	var shortSeen, longSeen bytes.Buffer
	for _, s := range []struct {
		name string
		body io.Reader
		seen *bytes.Buffer
	}{{"short", short.Body, &shortSeen}, {"long", long.Body, &longSeen}} {
		if r := (loadtest.StreamCheck{StopAfter: 1}).Check(io.TeeReader(s.body, s.seen)); !r.Stopped || r.Chunks != 1 {
			t.Fatalf("%s stream before the shutdown: %+v, want a first chunk", s.name, r)
		}
	}
	began := time.Now() // before the shutdown: its grace ends at least 1 s later
	stopped := make(chan error, 2)
	go func() { stopped <- stop() }()
	go func() { stopped <- stop2() }()
	rs := loadtest.StreamCheck{Want: nil}.Check(io.MultiReader(&shortSeen, short.Body))
	rl := loadtest.StreamCheck{Want: nil}.Check(io.MultiReader(&longSeen, long.Body))
	short.Body.Close()
	long.Body.Close()
	if rs.Lost || rs.Terminal != protocol.EventDone {
		t.Fatalf("short stream: %+v", rs)
	}
	if rl.Lost || rl.Terminal != protocol.EventError || rl.Problem.Slug() != protocol.ProblemShuttingDown || rl.Chunks == 0 {
		t.Fatalf("long stream: %+v", rl)
	}
	// Not before the grace; well before the endless stream's own end
	// (2,000 s) and the harness's 30 s wait for Serve.
	if d := time.Since(began); d < grace || d > 15*time.Second {
		t.Fatalf("long stream cut after %v, want about the %v grace", d, grace)
	}
	for range 2 {
		if err := <-stopped; err != nil {
			t.Fatalf("Serve: %v", err)
		}
	}
	if _, err := http.Get(url2 + "/healthz"); err == nil {
		t.Fatal("server still accepts connections after shutdown")
	}
}

// With API_KEYS set, a request needs a valid bearer key (plain or as its
// sha256: digest; a bare 64-hex entry is a key); anything else is 401
// problem+json.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, fastSim())
	digest := sha256.Sum256([]byte("hashed-key"))
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, map[string]string{
		"API_KEYS": "plain-key,sha256:" + hex.EncodeToString(digest[:]) + "=high," + strings.Repeat("ab", 32),
	})))
	for _, tc := range []struct {
		name, auth string
		status     int
	}{
		{"no header", "", http.StatusUnauthorized},
		{"wrong scheme", "Basic cGxhaW4ta2V5", http.StatusUnauthorized},
		{"wrong key", "Bearer nope", http.StatusUnauthorized},
		{"the digest itself is not a key", "Bearer " + hex.EncodeToString(digest[:]), http.StatusUnauthorized},
		{"plain key", "Bearer plain-key", http.StatusOK},
		{"key given as its sha256", "Bearer hashed-key", http.StatusOK},
		{"scheme in any case", "BEARER plain-key", http.StatusOK},
		{"64-hex key", "Bearer " + strings.Repeat("ab", 32), http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			resp := postStream(t, t.Context(), url, prompt("key"), hdr)
			if resp.StatusCode != tc.status {
				resp.Body.Close()
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.status != http.StatusOK {
				readProblem(t, resp)
				return
			}
			rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
			resp.Body.Close()
			if rep.Terminal != protocol.EventDone {
				t.Fatalf("%+v", rep)
			}
		})
	}
}
