package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// peakUpstream is a simllm upstream that counts the chat calls in flight
// and remembers the most it ever had at once. While status is set it
// answers every chat call with that status instead; it remembers the last
// user message of each call it answered (served).
type peakUpstream struct {
	url             string
	name            string // host:port, the upstream's name in Spillway
	calls, now, top atomic.Int64
	status          atomic.Int32

	mu     sync.Mutex
	served map[string]int
}

// doneWriter calls leave once, before the first write that carries the
// stream's [DONE] (or when the handler returns without one).
type doneWriter struct {
	http.ResponseWriter
	leave func()
	left  bool
}

func (w *doneWriter) leaveOnce() {
	if !w.left {
		w.left = true
		w.leave()
	}
}

func (w *doneWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("[DONE]")) {
		w.leaveOnce()
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (flushes and
// write deadlines).
func (w *doneWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (u *peakUpstream) servedCount(text string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.served[text]
}

func startPeakUpstream(tb testing.TB, sc llm.SimConfig) *peakUpstream {
	tb.Helper()
	sim, err := llm.NewSim(sc)
	if err != nil {
		tb.Fatal(err)
	}
	inner := simserver.New(sim, testLog(tb))
	u := &peakUpstream{served: map[string]int{}}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/chat/completions") {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			u.calls.Add(1)
			if s := u.status.Load(); s != 0 {
				w.WriteHeader(int(s))
				return
			}
			var chat struct {
				Messages []protocol.Message `json:"messages"`
			}
			if json.Unmarshal(body, &chat) == nil && len(chat.Messages) > 0 {
				u.mu.Lock()
				u.served[chat.Messages[len(chat.Messages)-1].Content]++
				u.mu.Unlock()
			}
			n := u.now.Add(1)
			for {
				top := u.top.Load()
				if n <= top || u.top.CompareAndSwap(top, n) {
					break
				}
			}
			// The call leaves the count just before its [DONE] is
			// written: from then on the api may end the call, release
			// its slot and start another while this handler is still
			// returning, and that is no excess.
			dw := &doneWriter{ResponseWriter: w, leave: func() { u.now.Add(-1) }}
			defer dw.leaveOnce()
			w = dw
		}
		inner.ServeHTTP(w, r)
	}))
	tb.Cleanup(ts.Close)
	u.url = ts.URL + "/v1"
	u.name = strings.TrimPrefix(ts.URL, "http://")
	return u
}

// Two api processes share one Redis and two capped upstreams: together
// they never put more than the cap on either upstream, both upstreams get
// work, and requests that find every upstream full go to the queue and
// still complete — nothing is refused and nothing is lost.
func TestSeveralUpstreamsShareCapsAcrossApis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	t.Parallel()
	const capEach = 2
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 5 * time.Millisecond, Tokens: 20, Seed: 11}
	up1, up2 := startPeakUpstream(t, sc), startPeakUpstream(t, sc)
	r := redistest.Start(t)
	env := map[string]string{
		"REDIS_URL": r.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": up1.url + "," + up2.url,
		"LLM_UPSTREAM_MAX_CONCURRENCY": fmt.Sprint(capEach),
		"CONNECTION_POOL_SIZE":         "50", "CONNECTION_POOL_PER_USER": "50",
		"EMBEDDED_WORKERS": "true", "WORKER_CONCURRENCY": "4",
		"WORKER_HEARTBEAT_SECONDS": "1", "QUEUE_RECLAIM_IDLE_SECONDS": "2",
		"QUEUE_FAILOVER_BASE_DELAY_MS": "10", "QUEUE_FAILOVER_MAX_DELAY_MS": "50",
		"SHUTDOWN_GRACE_SECONDS": "1",
	}
	_, url1, _ := startAPI(t, testConfig(t, env))
	_, url2, _ := startAPI(t, testConfig(t, env))

	const n = 24
	var (
		wg     sync.WaitGroup
		queued atomic.Int64
	)
	for i := range n {
		wg.Go(func() {
			url := url1
			if i%2 == 1 {
				url = url2
			}
			text := fmt.Sprint("several upstreams ", i)
			resp := postStream(t, t.Context(), url, prompt(text), map[string]string{"X-User-ID": fmt.Sprint("u", i)})
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: status %d", i, resp.StatusCode)
				return
			}
			rep := loadtest.StreamCheck{Want: llm.SimChunks(userMsgs(text), sc.Seed, sc.Tokens)}.Check(resp.Body)
			if rep.Lost || rep.Terminal != protocol.EventDone {
				t.Errorf("request %d: lost=%v reason=%s detail=%s terminal=%q", i, rep.Lost, rep.Reason, rep.Detail, rep.Terminal)
				return
			}
			if rep.Done.Path == protocol.PathQueued {
				queued.Add(1)
			}
			// Every upstream full sends a request to the queue as a full
			// pool does: no hand-off, no retrying event.
			if rep.Retryings != 0 || rep.Resets != 0 {
				t.Errorf("request %d: %d retrying events, %d resets; want none", i, rep.Retryings, rep.Resets)
			}
		})
	}
	wg.Wait()
	for i, u := range []*peakUpstream{up1, up2} {
		if top := u.top.Load(); top > capEach {
			t.Errorf("upstream %d had %d calls at once, cap %d", i+1, top, capEach)
		}
		if u.calls.Load() == 0 {
			t.Errorf("upstream %d got no call", i+1)
		}
	}
	// 24 concurrent requests on 4 upstream slots: most must have waited
	// in the queue rather than been refused.
	if queued.Load() == 0 {
		t.Errorf("no request took the queued path although every upstream was full")
	}
	t.Logf("calls %d/%d, peaks %d/%d, queued %d of %d", up1.calls.Load(), up2.calls.Load(), up1.top.Load(), up2.top.Load(), queued.Load(), n)
}

// streamOnce posts text with hdr to url and reads the stream to its end,
// checking the content against simllm's answer.
func streamOnce(t *testing.T, url, text string, sc llm.SimConfig, hdr map[string]string) loadtest.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp := postStream(t, ctx, url, prompt(text), hdr)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%q: status %d", text, resp.StatusCode)
	}
	rep := loadtest.StreamCheck{Want: llm.SimChunks(userMsgs(text), sc.Seed, sc.Tokens)}.Check(resp.Body)
	if rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("%q: lost=%v reason=%s detail=%s terminal=%q", text, rep.Lost, rep.Reason, rep.Detail, rep.Terminal)
	}
	return rep
}

// servedBy returns the indexes of the upstreams that answered text.
func servedBy(ups []*peakUpstream, text string) []int {
	var out []int
	for i, u := range ups {
		if u.servedCount(text) > 0 {
			out = append(out, i)
		}
	}
	return out
}

// LLM_ROUTING=affinity keeps each X-Session-ID on one upstream, on the
// direct path of one api and the queued path of another alike (the
// session travels with the job). When an upstream fails and is ejected,
// only its sessions move, each to one other upstream, and the failure is
// invisible to their clients; every other session stays where it was.
func TestUpstreamAffinityKeepsSessionsOnBothPaths(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 2 * time.Millisecond, TokenInterval: time.Millisecond, Tokens: 8, Seed: 5}
	ups := []*peakUpstream{startPeakUpstream(t, sc), startPeakUpstream(t, sc), startPeakUpstream(t, sc)}
	r := redistest.Start(t)
	env := func(direct bool) map[string]string {
		return map[string]string{
			"REDIS_URL": r.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
			"LLM_PROVIDER": "openai", "LLM_BASE_URL": ups[0].url + "," + ups[1].url + "," + ups[2].url,
			"LLM_ROUTING": "affinity", "LLM_UPSTREAM_MAX_FAILS": "1", "LLM_UPSTREAM_COOLDOWN_SECONDS": "600",
			"DIRECT_PATH_ENABLED": fmt.Sprint(direct), "EMBEDDED_WORKERS": "true", "WORKER_CONCURRENCY": "4",
			"CONNECTION_POOL_SIZE": "20", "CONNECTION_POOL_PER_USER": "20", "SHUTDOWN_GRACE_SECONDS": "1",
		}
	}
	_, directURL, _ := startAPI(t, testConfig(t, env(true)))
	_, queuedURL, _ := startAPI(t, testConfig(t, env(false)))

	const sessions = 12
	home := make([]int, sessions)
	var wg sync.WaitGroup
	// At most 3 sessions at once: no upstream is ever 4 calls busier than
	// another, so the balance escape (LLM_AFFINITY_BALANCE) never moves a
	// session here.
	running := make(chan struct{}, 3)
	for s := range sessions {
		wg.Go(func() {
			running <- struct{}{}
			defer func() { <-running }()
			for j := range 4 {
				url, path := directURL, protocol.PathDirect
				if j%2 == 1 {
					url, path = queuedURL, protocol.PathQueued
				}
				rep := streamOnce(t, url, fmt.Sprintf("session %d request %d", s, j), sc,
					map[string]string{"X-Session-ID": fmt.Sprint("conv-", s), "X-User-ID": fmt.Sprint("user-", s%3)})
				if rep.Done.Path != path {
					t.Errorf("session %d request %d: path %s, want %s", s, j, rep.Done.Path, path)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	perUpstream := make([]int, len(ups))
	for s := range sessions {
		set := map[int]bool{}
		for j := range 4 {
			for _, i := range servedBy(ups, fmt.Sprintf("session %d request %d", s, j)) {
				set[i] = true
			}
		}
		if len(set) != 1 {
			t.Fatalf("session %d served by upstreams %v; want one", s, set)
		}
		for i := range set {
			home[s] = i
			perUpstream[i]++
		}
	}
	lost := 0
	for i, n := range perUpstream {
		if n > perUpstream[lost] {
			lost = i
		}
	}
	t.Logf("sessions per upstream %v; upstream %d fails now", perUpstream, lost)

	ups[lost].status.Store(http.StatusServiceUnavailable)
	for s := range sessions {
		moved := map[int]bool{}
		for j := 4; j < 8; j++ {
			url := directURL
			if j%2 == 1 {
				url = queuedURL
			}
			text := fmt.Sprintf("session %d request %d", s, j)
			rep := streamOnce(t, url, text, sc, map[string]string{"X-Session-ID": fmt.Sprint("conv-", s)})
			if rep.Resets != 0 || rep.Retryings != 0 {
				t.Errorf("%s: %d resets, %d retrying events; the failover must be invisible", text, rep.Resets, rep.Retryings)
			}
			by := servedBy(ups, text)
			if len(by) != 1 {
				t.Fatalf("%s answered by %v", text, by)
			}
			moved[by[0]] = true
		}
		switch {
		case home[s] != lost && (len(moved) != 1 || !moved[home[s]]):
			t.Errorf("session %d on healthy upstream %d moved to %v", s, home[s], moved)
		case home[s] == lost && (len(moved) != 1 || moved[lost]):
			t.Errorf("session %d of the lost upstream went to %v; want one other upstream", s, moved)
		}
	}
	// One failure ejected it cluster-wide: each api tried it at most once
	// (the other learns of the ejection from Redis a moment later).
	if n := ups[lost].calls.Load() - int64(4*perUpstream[lost]); n < 1 || n > 2 {
		t.Errorf("the failing upstream got %d calls after it failed; want 1 or 2 (then ejected for both apis)", n)
	}
}

// One upstream's failures open only its own circuit breaker: its failures
// before the first chunk are retried at once on another upstream (no
// `retrying` event, no reset), it stops getting calls once its circuit
// opens, and the gate keeps admitting. Only when every circuit is open
// are new requests refused with 503 provider-unavailable.
func TestUpstreamCircuitOpensAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 2 * time.Millisecond, TokenInterval: time.Millisecond, Tokens: 8, Seed: 9}
	ups := []*peakUpstream{startPeakUpstream(t, sc), startPeakUpstream(t, sc), startPeakUpstream(t, sc)}
	bad := ups[1]
	bad.status.Store(http.StatusInternalServerError)
	r := redistest.Start(t)
	_, url, _ := startAPI(t, testConfig(t, map[string]string{
		"REDIS_URL": r.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": ups[0].url + "," + ups[1].url + "," + ups[2].url,
		"LLM_ROUTING": "weighted", "LLM_UPSTREAM_MAX_FAILS": "1000",
		"BREAKER_FAILURES": "3", "BREAKER_OPEN_SECONDS": "600",
		"EMBEDDED_WORKERS": "true", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "2",
		"CONNECTION_POOL_SIZE": "20", "CONNECTION_POOL_PER_USER": "20", "SHUTDOWN_GRACE_SECONDS": "1",
	}))
	for i := range 30 {
		text := fmt.Sprint("circuit ", i)
		rep := streamOnce(t, url, text, sc, nil)
		if rep.Done.Path != protocol.PathDirect || rep.Resets != 0 || rep.Retryings != 0 {
			t.Fatalf("%s: path %s, %d resets, %d retrying events; want direct with the failover unseen",
				text, rep.Done.Path, rep.Resets, rep.Retryings)
		}
	}
	if n := bad.calls.Load(); n != 3 {
		t.Fatalf("failing upstream got %d calls; want 3, then its circuit open", n)
	}
	metrics := url + "/metrics"
	for _, u := range ups {
		want := 0.0
		if u == bad {
			want = 2
		}
		if got := scrape(t, metrics, fmt.Sprintf(`spillway_circuit_state{provider=%q}`, u.name)); got != want {
			t.Errorf("circuit of %s: %v, want %v", u.name, got, want)
		}
	}
	if got := scrape(t, metrics, fmt.Sprintf(`spillway_upstream_responses_total{code="500",upstream=%q}`, bad.name)); got != 3 {
		t.Errorf("500 responses of %s: %v, want 3", bad.name, got)
	}
	if got := scrape(t, metrics, fmt.Sprintf(`spillway_upstream_responses_total{code="200",upstream=%q}`, ups[0].name)) +
		scrape(t, metrics, fmt.Sprintf(`spillway_upstream_responses_total{code="200",upstream=%q}`, ups[2].name)); got != 30 {
		t.Errorf("200 responses of the healthy upstreams: %v, want 30", got)
	}

	// Every upstream fails: once every circuit is open, new requests are
	// refused at once.
	ups[0].status.Store(http.StatusInternalServerError)
	ups[2].status.Store(http.StatusInternalServerError)
	testutil.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp := postStream(t, ctx, url, prompt("all down"), nil)
		if resp.StatusCode == http.StatusServiceUnavailable {
			p := readProblem(t, resp)
			if !strings.HasSuffix(p.Type, "/provider-unavailable") || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("refusal %+v (Retry-After %q), want provider-unavailable with a Retry-After", p, resp.Header.Get("Retry-After"))
			}
			return true
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return false
	}, "requests refused with every circuit open")
	if got := scrape(t, metrics, `spillway_queue_rejections_total{priority="normal",reason="circuit_open"}`); got < 1 {
		t.Errorf("circuit_open rejections %v, want at least 1", got)
	}
}

// Requests are checked against the upstreams before any call: a
// malformed X-Session-ID is a 400, and so is a model no upstream serves
// when every upstream lists its models; GET /v1/models lists their union.
func TestUpstreamModelsAndSessionHeader(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond, Tokens: 4, Seed: 3}
	a, b := startPeakUpstream(t, sc), startPeakUpstream(t, sc)
	file := filepath.Join(t.TempDir(), "spillway.yaml")
	yaml := fmt.Sprintf("upstreams:\n  - {name: a, base_url: %q, models: [m-a, m-shared]}\n  - {name: b, base_url: %q, models: [m-b, m-shared]}\n", a.url, b.url)
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(file, map[string]string{"LLM_PROVIDER": "openai", "SHUTDOWN_GRACE_SECONDS": "1"})
	if err != nil {
		t.Fatal(err)
	}
	_, url, _ := startAPI(t, cfg)
	ctx := context.Background()

	resp := postStream(t, ctx, url, prompt("hi"), map[string]string{"X-Session-ID": "conv 1"})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(readProblem(t, resp).Detail, "X-Session-ID") {
		t.Fatalf("malformed X-Session-ID: status %d, want 400 naming the header", resp.StatusCode)
	}
	body := prompt("hi")
	body["model"] = "m-c"
	if resp := postStream(t, ctx, url, body, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("model no upstream serves: status %d, want 400", resp.StatusCode)
	} else {
		readProblem(t, resp)
	}
	for _, m := range []string{"m-b", ""} {
		body := prompt("model " + m)
		if m != "" {
			body["model"] = m
		}
		resp := postStream(t, ctx, url, body, map[string]string{"X-Session-ID": "conv-1"})
		rep := loadtest.StreamCheck{Want: llm.SimChunks(userMsgs("model "+m), sc.Seed, sc.Tokens)}.Check(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || rep.Terminal != protocol.EventDone {
			t.Fatalf("model %q: status %d, terminal %q", m, resp.StatusCode, rep.Terminal)
		}
	}
	if a.servedCount("model m-b") != 0 || b.servedCount("model m-b") != 1 {
		t.Fatalf("m-b went to a %d times, b %d; want only b", a.servedCount("model m-b"), b.servedCount("model m-b"))
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/models", nil)
	mresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(mresp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	if strings.Join(ids, ",") != "m-a,m-shared,m-b" {
		t.Fatalf("GET /v1/models lists %v, want the union m-a, m-shared, m-b", ids)
	}
}

// With ADAPTIVE_CONCURRENCY and several upstreams each upstream has its
// own limit, one for the cluster: a replica that throttles above 2 calls
// at once has its limit lowered (the same in both apis) while the other
// keeps its full share, the pool keeps CONNECTION_POOL_SIZE, and every
// request completes.
func TestAdaptiveConcurrencyPerUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	t.Parallel()
	base := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 20 * time.Millisecond, Tokens: 16, Seed: 13}
	narrow := base
	narrow.MaxConcurrency = 2
	narrowSim, narrowURL := startSimllm(t, narrow)
	wideSim, wideURL := startSimllm(t, base)
	r := redistest.Start(t)
	env := map[string]string{
		"REDIS_URL": r.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": narrowURL + "," + wideURL,
		"CONNECTION_POOL_SIZE": "8", "CONNECTION_POOL_PER_USER": "8",
		"ADAPTIVE_CONCURRENCY": "true", "ADAPTIVE_INTERVAL_MS": "200", "LLM_RETRY_AFTER_MAX_SECONDS": "1",
		"LLM_UPSTREAM_COOLDOWN_SECONDS": "1", "QUEUE_FAILOVER_MAX_RETRIES": "20",
		"EMBEDDED_WORKERS": "true", "WORKER_CONCURRENCY": "8",
		"WORKER_HEARTBEAT_SECONDS": "1", "QUEUE_RECLAIM_IDLE_SECONDS": "2",
		"QUEUE_FAILOVER_BASE_DELAY_MS": "10", "QUEUE_FAILOVER_MAX_DELAY_MS": "50",
		"SHUTDOWN_GRACE_SECONDS": "1",
	}
	_, url, _ := startAPI(t, testConfig(t, env))
	_, url2, _ := startAPI(t, testConfig(t, env))
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Go(func() {
			to := url
			if i%2 == 1 {
				to = url2
			}
			rep := streamOnce(t, to, fmt.Sprint("adaptive per upstream ", i), base, map[string]string{"X-User-ID": fmt.Sprint("u", i)})
			if rep.Lost || rep.Terminal != protocol.EventDone {
				t.Errorf("request %d: lost=%v reason=%s detail=%s terminal=%q", i, rep.Lost, rep.Reason, rep.Detail, rep.Terminal)
			}
		})
	}
	wg.Wait()
	if narrowSim.Throttled() == 0 {
		t.Fatal("the narrow upstream never answered 429: nothing to adapt to")
	}
	if wideSim.Throttled() != 0 {
		t.Fatalf("the wide upstream answered %d 429s", wideSim.Throttled())
	}
	name := func(u string) string { return strings.TrimSuffix(strings.TrimPrefix(u, "http://"), "/v1") }
	limitIn := func(api, u string) float64 {
		return scrape(t, api+"/metrics", fmt.Sprintf("spillway_upstream_effective_limit{upstream=%q}", name(u)))
	}
	limit := func(u string) float64 { return limitIn(url, u) }
	// One limit for the cluster: both apis report the same lowered one.
	testutil.Eventually(t, 10*time.Second, func() bool {
		n := limit(narrowURL)
		return n >= 1 && n < 8 && limitIn(url2, narrowURL) == n
	}, "the narrow upstream's limit lowered, the same in both apis")
	if got := limit(wideURL); got != 8 {
		t.Errorf("the wide upstream's limit is %v, want its full 8", got)
	}
	if got := scrape(t, url+"/metrics", "spillway_pool_effective_limit"); got != 8 {
		t.Errorf("pool limit %v, want CONNECTION_POOL_SIZE: with several upstreams each adapts alone", got)
	}
	t.Logf("narrow limit %v after %d throttles; wide served %d calls", limit(narrowURL), narrowSim.Throttled(), wideSim.Requests())
}
