package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// errUpstream is a failure the provider owns, as a worker's or the
// direct path's last error would be.
var errUpstream = &llm.Error{Status: 502, Retryable: true, Err: errors.New("bad gateway")}

// degradeState is what an api's /metrics says of its degradation level,
// and the highest state of its provider circuits (0 closed) over the
// circuits it reported.
type degradeState struct {
	level, errorRate, latestRate, requests, backlog, wait float64
	circuit                                               float64
	circuits                                              int
}

// readDegrade scrapes the degradation level and its inputs; safe to call
// from any goroutine.
func readDegrade(url string) (degradeState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return degradeState{}, err
	}
	defer resp.Body.Close()
	var s degradeState
	want := map[string]*float64{
		"spillway_degradation_level": &s.level,
		`spillway_degradation_input{input="` + admission.InputErrorRate + `"}`: &s.errorRate,
		`spillway_degradation_input{input="` + admission.InputRequests + `"}`:  &s.requests,
		`spillway_degradation_input{input="` + admission.InputLatest + `"}`:    &s.latestRate,
		`spillway_degradation_input{input="` + admission.InputBacklog + `"}`:   &s.backlog,
		`spillway_degradation_input{input="` + admission.InputQueueWait + `"}`: &s.wait,
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && strings.HasPrefix(name, "spillway_circuit_state{") {
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return s, fmt.Errorf("metric %s: %w", name, err)
			}
			s.circuit = max(s.circuit, v)
			s.circuits++
			continue
		}
		if p := want[name]; ok && p != nil {
			if *p, err = strconv.ParseFloat(val, 64); err != nil {
				return s, fmt.Errorf("metric %s: %w", name, err)
			}
		}
	}
	return s, sc.Err()
}

// tryStream posts text to url and checks the stream against sc's answer;
// unlike streamOnce it may run in any goroutine and fails nothing.
func tryStream(url, text string, sc llm.SimConfig, hdr map[string]string) (int, loadtest.Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/stream",
		strings.NewReader(fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, text)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, loadtest.Report{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, loadtest.Report{}, nil
	}
	return resp.StatusCode, loadtest.StreamCheck{Want: llm.SimChunks(userMsgs(text), sc.Seed, sc.Tokens)}.Check(resp.Body), nil
}

// degradedRefusals is how many requests url refused for the degradation
// level, over every priority.
func degradedRefusals(t *testing.T, url string) float64 {
	t.Helper()
	var n float64
	for _, p := range protocol.Priorities {
		n += scrape(t, url+"/metrics", `spillway_queue_rejections_total{priority="`+string(p)+`",reason="degraded"}`)
	}
	return n
}

// The degradation level end to end, on real Redis: failed requests
// reported by another process (as a consumer's worker would) raise both
// apis' level through the cluster-wide last minute, once they held for
// the raise delay; at level 2 a low request is refused with 503
// queue-overflow and a normal one gets at most DEGRADE_MAX_TOKENS chunks
// while a high one gets its whole answer. Failures alone never reach
// level 3. Each refusal is counted by priority.
func TestDegradationLevelsEndToEnd(t *testing.T) {
	t.Parallel()
	const maxTokens = 3
	times := DegradeTimes{RaiseAfter: time.Second, Hold: 3 * time.Second}
	c := newCluster(t, fastSim(), map[string]string{"DEGRADE_MAX_TOKENS": "3", "PRIORITY_MAX": "high"})
	_, url, _ := startAPIWith(t, testConfig(t, c.env), Options{DegradeTimes: times})
	_, url2, _ := startAPIWith(t, testConfig(t, c.env), Options{DegradeTimes: times})
	metrics := url + "/metrics"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	// Another process's view of the requests: they go into the same
	// Redis hash the apis read.
	other, err := admission.NewRecent(admission.RecentConfig{Prefix: c.prefix}, c.rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	report := func(failed, ok int) {
		for range failed {
			other.ObserveRequest(errUpstream)
		}
		for range ok {
			other.ObserveRequest(nil)
		}
		other.Refresh(ctx, time.Now())
	}
	level := func(want float64) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() bool {
			return scrape(t, metrics, "spillway_degradation_level") == want &&
				scrape(t, url2+"/metrics", "spillway_degradation_level") == want
		}, "degradation level on both apis")
	}
	level(0)
	answer := func(prio string) (int, loadtest.Report) {
		t.Helper()
		resp := postStream(t, ctx, url, prompt("degraded "+prio), map[string]string{"X-Priority": prio})
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			p := readProblem(t, resp)
			if p.Slug() != protocol.ProblemQueueOverflow || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("%s refused with %+v (Retry-After %q), want queue-overflow with Retry-After", prio, p, resp.Header.Get("Retry-After"))
			}
			return resp.StatusCode, loadtest.Report{}
		}
		return resp.StatusCode, loadtest.StreamCheck{Want: nil}.Check(resp.Body)
	}

	// 30 % of 100 requests failed: level 2 on both apis.
	report(30, 70)
	level(2)
	if code, _ := answer("low"); code != http.StatusServiceUnavailable {
		t.Errorf("low at level 2: HTTP %d, want 503", code)
	}
	if code, rep := answer("normal"); code != http.StatusOK || rep.Terminal != protocol.EventDone || rep.Chunks != maxTokens ||
		rep.Done == nil || rep.Done.FinishReason != "length" {
		t.Errorf("normal at level 2: HTTP %d, %+v; want done after %d chunks, finish length", code, rep, maxTokens)
	}
	if code, rep := answer("high"); code != http.StatusOK || rep.Terminal != protocol.EventDone || rep.Chunks != c.tokens {
		t.Errorf("high at level 2: HTTP %d, %+v; want all %d chunks", code, rep, c.tokens)
	}

	// Failures pile up to over half: still level 2, failures alone are
	// never critical. Watched for three raise delays after the apis saw
	// the rate.
	report(90, 0)
	testutil.Eventually(t, 10*time.Second, func() bool {
		return scrape(t, metrics, `spillway_degradation_input{input="error_rate"}`) > 0.5
	}, "the api seeing over half failed")
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
	for end := time.Now().Add(3 * times.RaiseAfter); time.Now().Before(end); <-watch.C {
		if lvl := scrape(t, metrics, "spillway_degradation_level"); lvl != 2 {
			t.Fatalf("level %v with only the failure rate critical, want 2", lvl)
		}
	}
	if code, rep := answer("normal"); code != http.StatusOK || rep.Terminal != protocol.EventDone {
		t.Errorf("normal with only the failure rate critical: HTTP %d, %+v; want it served", code, rep)
	}
	for prio, want := range map[string]float64{"low": 1, "normal": 0, "high": 0} {
		if got := scrape(t, metrics, `spillway_queue_rejections_total{priority="`+prio+`",reason="degraded"}`); got != want {
			t.Errorf("degraded refusals of %s: %v, want %v", prio, got, want)
		}
	}
}

// A backlog at 80 % of QUEUE_OVERFLOW_THRESHOLD is real pressure: it
// raises level 3 at once (in the step that reads it, well within the
// failure rate's 10 s), on both apis, which then refuse normal requests
// but one in DEGRADE_PROBE_EVERY.
func TestDegradationBacklogActsAtOnce(t *testing.T) {
	t.Parallel()
	const threshold = 10
	c := newCluster(t, fastSim(), map[string]string{
		"QUEUE_OVERFLOW_THRESHOLD": strconv.Itoa(threshold), "QUEUE_OVERFLOW_HYSTERESIS": "1",
		"QUEUE_DEPTH_CACHE_TTL_MS": "200", "DIRECT_PATH_ENABLED": "false", "PRIORITY_MAX": "high",
		"QUEUE_FAILOVER_TIMEOUT_SECONDS": "120",
	})
	_, url := c.api(nil)
	_, url2 := c.api(nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// No worker: eight high requests wait in the queue.
	for i := range threshold * 8 / 10 {
		resp := postStream(t, ctx, url, prompt(fmt.Sprint("backlog ", i)), map[string]string{"X-Priority": "high"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("high request %d: HTTP %d", i, resp.StatusCode)
		}
		defer resp.Body.Close()
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return c.backlog() == threshold*8/10 }, "eight jobs queued")
	queued := time.Now()
	// At once: the step that reads the backlog at 80 % sets level 3,
	// whatever the machine's load makes of the time a depth refresh and
	// a step take. A scrape may straddle that step's gauges, so it takes
	// two readings in a row (a step lasts a second, a reading
	// milliseconds) to show the backlog without the level.
	readings, lagging := 0, map[string]int{}
	testutil.Eventually(t, 20*time.Second, func() bool {
		at3 := true
		for _, u := range []string{url, url2} {
			s, err := readDegrade(u)
			if err != nil {
				t.Fatal(err)
			}
			readings++
			switch {
			case s.backlog < 0.8 || s.level == 3:
				lagging[u] = 0
			case lagging[u] > 0:
				t.Fatalf("%s read the backlog at %v twice and stayed at level %v; want level 3 in the same step", u, s.backlog, s.level)
			default:
				lagging[u]++
			}
			at3 = at3 && s.level == 3 && s.backlog >= 0.8 && s.requests == 0
		}
		return at3
	}, "level 3 on both apis, the backlog input at 80 %")
	took := time.Since(queued)
	if took >= admission.DegradeRaiseAfter {
		t.Errorf("level 3 %s after the backlog reached 80 %%; want it sooner than the failure rate could ever raise a level (%s)", took, admission.DegradeRaiseAfter)
	}
	for i := range admission.DefaultDegradeProbeEvery {
		resp := postStream(t, ctx, url, prompt(fmt.Sprint("normal at 3 ", i)), nil)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("normal request %d at level 3 with the backlog at the normal shedding level: HTTP %d, want 503", i, resp.StatusCode)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Nine refused by the level; the probe passed it, and met the
	// overflow gate's own shedding.
	if got := scrape(t, url+"/metrics", `spillway_queue_rejections_total{priority="normal",reason="degraded"}`); got != admission.DefaultDegradeProbeEvery-1 {
		t.Errorf("degraded refusals of normal: %v, want %d (one in %d probes)", got, admission.DefaultDegradeProbeEvery-1, admission.DefaultDegradeProbeEvery)
	}
	t.Logf("level 3 %s after the backlog reached 80 %% (%d readings of the inputs)", took.Round(time.Millisecond), readings)
}

// commandUpstream is a simllm upstream that misbehaves on command: the
// next stall calls fall silent after their first chunk until the caller
// gives up, and while fail is set, a call whose last message starts with
// "fail 500" is answered 500 and one that starts with "fail stall" falls
// silent after its first chunk.
type commandUpstream struct {
	url                  string
	ok, stuck            *simserver.Server
	stall                atomic.Int32
	fail                 atomic.Bool
	failed500, failStall atomic.Int64
}

func startCommandUpstream(tb testing.TB, sc llm.SimConfig) *commandUpstream {
	tb.Helper()
	newSim := func(sc llm.SimConfig) *simserver.Server {
		sim, err := llm.NewSim(sc)
		if err != nil {
			tb.Fatal(err)
		}
		return simserver.New(sim, testLog(tb))
	}
	u := &commandUpstream{ok: newSim(sc)}
	stalled := sc
	stalled.StallAfter = 1
	u.stuck = newSim(stalled)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/chat/completions") {
			u.ok.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		switch {
		case u.fail.Load() && strings.Contains(string(body), `"content":"fail 500`):
			u.failed500.Add(1)
			http.Error(w, `{"error":{"message":"on command","type":"server_error"}}`, http.StatusInternalServerError)
		case u.fail.Load() && strings.Contains(string(body), `"content":"fail stall`):
			u.failStall.Add(1)
			u.stuck.ServeHTTP(w, r)
		case u.stall.Add(-1) >= 0:
			u.stuck.ServeHTTP(w, r)
		default:
			u.stall.Store(0)
			u.ok.ServeHTTP(w, r)
		}
	}))
	tb.Cleanup(ts.Close)
	u.url = ts.URL + "/v1"
	return u
}

// degradeEnv is the settings of an api with adaptive concurrency and
// in-process workers in front of upstream.
func degradeEnv(t *testing.T, upstream string, over map[string]string) map[string]string {
	t.Helper()
	r := redistest.Start(t)
	env := map[string]string{
		"REDIS_URL": r.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": upstream,
		"ADAPTIVE_CONCURRENCY": "true", "CONNECTION_POOL_SIZE": "20", "CONNECTION_POOL_PER_USER": "20",
		"EMBEDDED_WORKERS": "true", "WORKER_CONCURRENCY": "20",
		"WORKER_HEARTBEAT_SECONDS": "1", "QUEUE_RECLAIM_IDLE_SECONDS": "2",
		"QUEUE_FAILOVER_BASE_DELAY_MS": "10", "QUEUE_FAILOVER_MAX_DELAY_MS": "50",
		"SHUTDOWN_GRACE_SECONDS": "1",
	}
	for k, v := range over {
		env[k] = v
	}
	return env
}

// One stalled answer on an otherwise healthy api, with the default
// degradation settings: the idle timeout cuts it, it is one failed
// request of one, and nobody is refused for it: the level stays 0 while
// that 100 % stands alone for longer than the raise delay, and in the next
// thirty requests (the issue this rule came from refused every normal
// request for 87 s).
func TestDegradationIgnoresOneStalledAnswer(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 2 * time.Millisecond, Tokens: 10, Seed: 41}
	up := startCommandUpstream(t, sc)
	_, url, _ := startAPI(t, testConfig(t, degradeEnv(t, up.url, map[string]string{"LLM_IDLE_TIMEOUT_SECONDS": "1"})))

	up.stall.Store(1)
	_, rep, err := tryStream(url, "stall me", sc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Terminal != protocol.EventError || rep.Problem == nil || rep.Problem.Slug() != protocol.ProblemProviderError {
		t.Fatalf("stalled answer: %+v; want cut with provider-error", rep)
	}
	// The api has counted it: one failed of one, 100 %.
	testutil.Eventually(t, 10*time.Second, func() bool {
		s, err := readDegrade(url)
		return err == nil && s.requests == 1 && s.errorRate == 1
	}, "the stalled answer counted as one failed request")
	// One of one stands for the raise delay and two steps more: too few
	// requests to count (and the latest seconds hold it 5 to 10 s, not
	// past the raise delay either).
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
	for end := time.Now().Add(admission.DegradeRaiseAfter + 2*time.Second); time.Now().Before(end); <-watch.C {
		s, err := readDegrade(url)
		if err != nil {
			t.Fatal(err)
		}
		if s.level != 0 || s.requests != 1 {
			t.Fatalf("level %v with %v requests in the window after one stalled answer; want 0 with that one", s.level, s.requests)
		}
	}
	for i := range 30 {
		text := fmt.Sprint("after the stall ", i)
		if code, rep, err := tryStream(url, text, sc, nil); err != nil || code != http.StatusOK || rep.Lost || rep.Terminal != protocol.EventDone {
			t.Fatalf("%s: HTTP %d, %+v, %v; want done", text, code, rep, err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		s, err := readDegrade(url)
		return err == nil && s.requests == 31
	}, "31 requests counted")
	s, err := readDegrade(url)
	if err != nil {
		t.Fatal(err)
	}
	if s.level != 0 || degradedRefusals(t, url) != 0 {
		t.Errorf("level %v, %v refused for degradation; want 0 and none", s.level, degradedRefusals(t, url))
	}
}

// A 429 burst at the start of a busy period, against an upstream that
// serves 4 streams and answers 429 Retry-After: 1 beyond: the adaptive
// limit converges (429s at most 15 % of the upstream calls of the last
// 10 s), at least 90 % of the requests are answered, and the 429s never
// count as failures: the failure input reads 0 throughout and nobody is
// refused for degradation. Thirty clients queue for four upstream slots:
// on a loaded machine their queue wait is real pressure and may raise
// level 1 (which refuses nobody); any level must be one the queue wait or
// the backlog reached.
func TestDegradationIgnoresA429Burst(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: 10, Seed: 42,
		MaxConcurrency: 4, FailRetryAfter: time.Second}
	sim, upstream := startSimllm(t, sc)
	_, url, _ := startAPI(t, testConfig(t, degradeEnv(t, upstream, nil)))

	// The degradation inputs, read four times a second while the load
	// runs and once after it.
	ctx, cancel := context.WithCancel(t.Context())
	var (
		states []degradeState
		watch  sync.WaitGroup
	)
	watch.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if s, err := readDegrade(url); err == nil {
				states = append(states, s)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})

	const run = 20 * time.Second
	var callsAt, throttledAt atomic.Int64
	mark := time.AfterFunc(run-10*time.Second, func() {
		callsAt.Store(sim.Requests())
		throttledAt.Store(sim.Throttled())
	})
	defer mark.Stop()
	res, err := loadtest.Run(t.Context(), loadtest.Config{
		URL: url + "/v1/stream", Concurrency: 30, Duration: run, DistinctPrompts: 200,
		Seed: sc.Seed, Tokens: sc.Tokens, Verify: true, UserIDs: 30, Timeout: time.Minute,
	}, nil)
	cancel()
	watch.Wait()
	if err != nil {
		t.Fatal(err)
	}
	calls, throttled := sim.Requests()-callsAt.Load(), sim.Throttled()-throttledAt.Load()
	t.Logf("%d requests: %d done, %d errors %v, %d refused %v; last 10 s: %d upstream calls, %d answered 429; all in all %d 429s of %d calls",
		res.Requests, res.Done, res.Errors, res.ErrorsByType, res.Refused, res.RefusedBy, calls, throttled, sim.Throttled(), sim.Requests())
	if sim.Throttled() == 0 {
		t.Fatal("the upstream never answered 429: nothing to adapt to")
	}
	if res.Lost != 0 || float64(res.Done) < 0.9*float64(res.Requests) {
		t.Errorf("%d of %d requests done, %d lost; want at least 90 %% done", res.Done, res.Requests, res.Lost)
	}
	if calls == 0 || float64(throttled) > 0.15*float64(calls) {
		t.Errorf("last 10 s: %d of %d upstream calls answered 429; want at most 15 %%", throttled, calls)
	}
	if n := degradedRefusals(t, url); n != 0 {
		t.Errorf("%v requests refused for degradation; want none", n)
	}
	s, err := readDegrade(url)
	if err != nil {
		t.Fatal(err)
	}
	states = append(states, s)
	// The level never exceeds what real pressure reached: the queue wait
	// (5 / 15 / 25 s) or the backlog (10 / 50 / 80 %) of the last minute,
	// which covers the run.
	pressure, top := 0.0, degradeState{}
	for _, s := range states {
		for i, w := range [...]float64{5, 15, 25} {
			if s.wait >= w {
				pressure = max(pressure, float64(i+1))
			}
		}
		for i, b := range [...]float64{0.1, 0.5, 0.8} {
			if s.backlog >= b {
				pressure = max(pressure, float64(i+1))
			}
		}
		top.level, top.wait, top.requests = max(top.level, s.level), max(top.wait, s.wait), max(top.requests, s.requests)
		top.errorRate, top.latestRate = max(top.errorRate, s.errorRate), max(top.latestRate, s.latestRate)
	}
	if top.errorRate != 0 || top.latestRate != 0 {
		t.Errorf("failure input up to %v (latest up to %v) during a burst the adaptive limit absorbed; want 0 throughout", top.errorRate, top.latestRate)
	}
	if top.level > pressure {
		t.Errorf("level %v, and the queue wait p99 and the backlog reached level %v at most; want no level above what they reach", top.level, pressure)
	}
	if len(states) < 10 || top.requests == 0 {
		t.Errorf("%d readings of the inputs, at most %v requests ended in the window; want the window read through the run", len(states), top.requests)
	}
	t.Logf("%d readings: highest level %v, queue wait p99 up to %.1f s, up to %v requests in the window, failure input up to %v", len(states), top.level, top.wait, top.requests, top.errorRate)
}

// Three replicas, one answering 503: every request is served by the other
// two, so each counts once, as served, and nobody is refused for
// degradation, then or in the requests after.
func TestDegradationIgnoresAFailingReplica(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 2 * time.Millisecond, TokenInterval: time.Millisecond, Tokens: 8, Seed: 43}
	ups := []*peakUpstream{startPeakUpstream(t, sc), startPeakUpstream(t, sc), startPeakUpstream(t, sc)}
	bad := ups[1]
	bad.status.Store(http.StatusServiceUnavailable)
	_, url, _ := startAPI(t, testConfig(t, degradeEnv(t, ups[0].url+","+ups[1].url+","+ups[2].url, nil)))

	const burst, after = 24, 12
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			text := fmt.Sprint("replicas ", i)
			code, rep, err := tryStream(url, text, sc, map[string]string{"X-User-ID": fmt.Sprint("u", i)})
			if err != nil || code != http.StatusOK || rep.Lost || rep.Terminal != protocol.EventDone {
				t.Errorf("%s: HTTP %d, %+v, %v; want done", text, code, rep, err)
			}
		})
	}
	wg.Wait()
	for i := range after {
		text := fmt.Sprint("replicas after ", i)
		if code, rep, err := tryStream(url, text, sc, nil); err != nil || code != http.StatusOK || rep.Lost || rep.Terminal != protocol.EventDone {
			t.Errorf("%s: HTTP %d, %+v, %v; want done", text, code, rep, err)
		}
	}
	if bad.calls.Load() == 0 {
		t.Fatal("the failing replica was never called: nothing to absorb")
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		s, err := readDegrade(url)
		return err == nil && s.requests == burst+after
	}, "every request counted once")
	s, err := readDegrade(url)
	if err != nil {
		t.Fatal(err)
	}
	if s.level != 0 || s.errorRate != 0 || degradedRefusals(t, url) != 0 {
		t.Errorf("level %v, failure rate %v, %v refused for degradation; want 0, 0, none (the failing replica made %d calls)",
			s.level, s.errorRate, degradedRefusals(t, url), bad.calls.Load())
	}
}

// sample is one reading of both apis' degradation state, taken between
// from and to.
type sample struct {
	from, to time.Time
	a, b     degradeState
}

// moment is when a change was seen in a series of samples: after the
// last reading without it began and by the time the first reading with it
// ended, so a slow scrape widens the moment instead of moving it.
type moment struct{ after, by time.Time }

// firstSeen is the first moment, in the samples that began at or after
// from, at which cond held.
func firstSeen(s []sample, from time.Time, cond func(sample) bool) (moment, bool) {
	after := from
	for _, x := range s {
		if x.from.Before(from) {
			continue
		}
		if cond(x) {
			return moment{after, x.to}, true
		}
		after = x.from
	}
	return moment{}, false
}

// gap is the shortest and the longest the time from m to n can have been.
func gap(m, n moment) (shortest, longest time.Duration) {
	return n.after.Sub(m.by), n.by.Sub(m.after)
}

// A real, sustained failure, with the default degradation times (the last
// minute, 10 s to raise, 30 s to leave), on two apis: for a minute three
// requests in five fail (one answered 500, two falling silent mid-answer
// until the idle timeout cuts them), hundreds of them. The failure rate
// stays over level 3's 50 %, yet the level rises to 2 only, no sooner than
// 10 s after the rate crossed a threshold, on both apis alike; and is
// left 30 s after the failure input stopped counting, which its latest
// seconds show soon after the failure ended although the minute still
// holds it. Nobody asking normal is refused meanwhile.
//
// Three in five rather than half, so that the rate stays over 50 % and
// the failure input's cap is tested. The circuit breaker is another
// mechanism and must stay closed: stalls cut by the idle timeout do not
// count against it, and its failure ratio (0.5, not a setting) needs 20
// calls finished within its window, which a window of one second never
// holds here (four clients, each at most three calls finished a second
// while failing). With the default minute, how two processes' workers
// happened to share the jobs once put one breaker's ratio over half at
// its 20th call, and the open circuit refused the rest of the test.
func TestDegradationFollowsASustainedFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of failure and the 30 s hold")
	}
	t.Parallel()
	const (
		failFor = admission.RecentWindow
		raise   = admission.DegradeRaiseAfter
		hold    = admission.DegradeHold
		// latest is the longest the latest seconds of the window hold a
		// failure: its two latest 5 s buckets, after a stall under way
		// when the failure ended was cut (the 1 s idle timeout) and
		// counted (flushed within a second).
		latest = admission.RecentWindow/6 + 2*time.Second
		// late bounds how much later than its time a change may show: a
		// second for the Recent read, one for the level's step, one for
		// a loaded machine.
		late = 3 * time.Second
	)
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 2 * time.Millisecond, Tokens: 8, Seed: 44}
	up := startCommandUpstream(t, sc)
	env := degradeEnv(t, up.url, map[string]string{
		"BREAKER_FAILURES": "100000", "BREAKER_WINDOW_SECONDS": "1",
		"DIRECT_PATH_ENABLED": "false", "QUEUE_FAILOVER_MAX_RETRIES": "0",
		"LLM_IDLE_TIMEOUT_SECONDS": "1",
	})
	_, urlA, _ := startAPI(t, testConfig(t, env))
	_, urlB, _ := startAPI(t, testConfig(t, env))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		mu      sync.Mutex
		samples []sample
		results = map[string]int{}
		load    sync.WaitGroup
	)
	load.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			from := time.Now()
			a, errA := readDegrade(urlA)
			b, errB := readDegrade(urlB)
			if errA == nil && errB == nil {
				mu.Lock()
				samples = append(samples, sample{from, time.Now(), a, b})
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	})
	// Four clients, two on each api, at most ten requests a second each;
	// while the upstream fails, requests 0, 2 and 4 of every five fail
	// (stall, 500, stall), so each client's failures lead its successes.
	for c := range 4 {
		load.Go(func() {
			url := urlA
			if c%2 == 1 {
				url = urlB
			}
			pace := time.NewTicker(100 * time.Millisecond)
			defer pace.Stop()
			for i := 0; ctx.Err() == nil; i++ {
				text := fmt.Sprint("ok ", c, " ", i)
				switch i % 5 {
				case 0, 4:
					text = fmt.Sprint("fail stall ", c, " ", i)
				case 2:
					text = fmt.Sprint("fail 500 ", c, " ", i)
				}
				rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
				req, _ := http.NewRequestWithContext(rctx, http.MethodPost, url+"/v1/stream",
					strings.NewReader(fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, text)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				outcome := "transport"
				if err == nil {
					if resp.StatusCode != http.StatusOK {
						var p protocol.Problem
						_ = json.NewDecoder(resp.Body).Decode(&p)
						outcome = fmt.Sprint("refused ", resp.StatusCode, " ", p.Slug())
					} else {
						rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
						outcome = rep.Terminal
						if rep.Problem != nil {
							outcome += " " + rep.Problem.Slug()
						}
					}
					resp.Body.Close()
				}
				rcancel()
				if ctx.Err() != nil {
					return
				}
				outcome = strings.Fields(text)[0] + ": " + outcome
				mu.Lock()
				results[outcome]++
				mu.Unlock()
				select {
				case <-ctx.Done():
				case <-pace.C:
				}
			}
		})
	}
	series := func() []sample {
		mu.Lock()
		defer mu.Unlock()
		return append([]sample(nil), samples...)
	}

	// The failure, for a minute.
	up.fail.Store(true)
	failFrom := time.Now()
	testutil.Eventually(t, failFor, func() bool {
		s := series()
		return len(s) > 0 && s[len(s)-1].a.level >= 2 && s[len(s)-1].b.level >= 2
	}, "level 2 on both apis")
	if wait := failFor - time.Since(failFrom); wait > 0 {
		<-time.After(wait) // the failure's length, not a wait for a condition
	}
	up.fail.Store(false)
	failTo := time.Now()
	testutil.Eventually(t, 2*time.Minute, func() bool {
		s := series()
		return len(s) > 0 && s[len(s)-1].from.After(failTo) && s[len(s)-1].a.level == 0 && s[len(s)-1].b.level == 0
	}, "level 0 on both apis after the failure")
	cancel()
	load.Wait()

	s := series()
	mu.Lock()
	failedAs := "fail: " + protocol.EventError + " " + protocol.ProblemProviderError
	failed := results[failedAs]
	for k, n := range results {
		if k != "ok: "+protocol.EventDone && k != "fail: "+protocol.EventDone && k != failedAs {
			t.Errorf("%d requests ended %q; want every one done, or failed with provider-error when sent to fail", n, k)
		}
	}
	t.Logf("outcomes %v; upstream: %d answered 500, %d stalled", results, up.failed500.Load(), up.failStall.Load())
	mu.Unlock()
	if failed < 40 {
		t.Errorf("%d requests failed during the failure; want at least 40", failed)
	}

	for _, x := range s {
		if x.a.circuits == 0 || x.b.circuits == 0 {
			t.Fatalf("an api reported no spillway_circuit_state at %s after the failure began: the circuits cannot be checked",
				x.to.Sub(failFrom).Round(time.Millisecond))
		}
		if x.a.circuit != 0 || x.b.circuit != 0 {
			t.Fatalf("a provider circuit left closed at %s after the failure began (states %v, %v): the breaker, not the degradation level, refused requests",
				x.to.Sub(failFrom).Round(time.Millisecond), x.a.circuit, x.b.circuit)
		}
		if x.a.level == 3 || x.b.level == 3 {
			t.Fatalf("level 3 at %s after the failure began: failures alone must not reach it", x.to.Sub(failFrom).Round(time.Millisecond))
		}
	}
	// The failure rate must have held over 50 % long enough to raise
	// level 3 were it allowed to, or the cap went untested.
	var longest time.Duration
	var overFrom time.Time
	for _, x := range s {
		if x.a.requests >= admission.DefaultDegradeMinRequests && x.a.errorRate >= 0.5 && x.a.latestRate >= 0.5 {
			if overFrom.IsZero() {
				overFrom = x.from
			}
			longest = max(longest, x.to.Sub(overFrom))
		} else {
			overFrom = time.Time{}
		}
	}
	if longest < raise+late {
		t.Errorf("the failure rate held at level 3's 50 %% for %s at most; want over %s, so that its cap is tested", longest, raise+late)
	}
	t.Logf("the failure rate (minute and latest seconds) held at or over 50 %% for %s at most", longest.Round(100*time.Millisecond))

	thresholds := [...]float64{0.05, 0.20}
	type api struct {
		name        string
		of          func(sample) degradeState
		raised      [2]moment
		below, left moment
		crossed     [2]moment
	}
	apis := []*api{{name: "a", of: func(x sample) degradeState { return x.a }}, {name: "b", of: func(x sample) degradeState { return x.b }}}
	for _, p := range apis {
		ok := true
		for k, thr := range thresholds {
			var c, r bool
			p.crossed[k], c = firstSeen(s, failFrom, func(x sample) bool {
				d := p.of(x)
				return d.requests >= admission.DefaultDegradeMinRequests && d.errorRate >= thr && d.latestRate >= thr
			})
			p.raised[k], r = firstSeen(s, failFrom, func(x sample) bool { return p.of(x).level >= float64(k+1) })
			ok = ok && c && r
		}
		var b, l bool
		p.below, b = firstSeen(s, failTo, func(x sample) bool {
			d := p.of(x)
			return d.requests < admission.DefaultDegradeMinRequests || d.errorRate < thresholds[0] || d.latestRate < thresholds[0]
		})
		if b {
			p.left, l = firstSeen(s, p.below.after, func(x sample) bool { return p.of(x).level == 0 })
		}
		if !ok || !b || !l {
			t.Fatalf("api %s: a moment is missing from the series (crossed, raised, below, left: %+v)", p.name, p)
		}
		at := func(m moment) time.Duration { return m.by.Sub(failFrom).Round(100 * time.Millisecond) }
		t.Logf("api %s, from the failure's start: rate over 5 %% by %s, level 1 by %s; over 20 %% by %s, level 2 by %s; failure ended at %s, input below by %s, level 0 by %s (%s after the failure ended)",
			p.name, at(p.crossed[0]), at(p.raised[0]), at(p.crossed[1]), at(p.raised[1]),
			failTo.Sub(failFrom).Round(100*time.Millisecond), at(p.below), at(p.left), p.left.by.Sub(failTo).Round(100*time.Millisecond))
		for k := range thresholds {
			if shortest, longest := gap(p.crossed[k], p.raised[k]); longest < raise || shortest > raise+late {
				t.Errorf("api %s: level %d raised %s to %s after the rate crossed %v; want the raise delay, %s",
					p.name, k+1, shortest, longest, thresholds[k], raise)
			}
		}
		// The level was last reached one step before the input was seen
		// below, and is left the hold after that step.
		if shortest, longest := gap(p.below, p.left); longest < hold-time.Second || shortest > hold+late {
			t.Errorf("api %s: level left %s to %s after the failure input stopped counting; want the hold, %s", p.name, shortest, longest, hold)
		}
		// The minute still holds the failures when the level is left: its
		// latest seconds showed the recovery.
		if shortest, longest := p.left.after.Sub(failTo), p.left.by.Sub(failTo); longest < hold-time.Second || shortest > hold+latest+late {
			t.Errorf("api %s: level left %s to %s after the failure ended; want the hold after the latest seconds showed it, %s to %s",
				p.name, shortest, longest, hold, hold+latest)
		}
	}
	// Both apis read one cluster-wide minute: they change level together,
	// a Recent read and a step apart at most.
	apart := func(m, n moment) time.Duration { return max(0, m.after.Sub(n.by), n.after.Sub(m.by)) }
	for k := range thresholds {
		if d := apart(apis[0].raised[k], apis[1].raised[k]); d > late {
			t.Errorf("level %d raised at least %s apart on the two apis; want the same level", k+1, d)
		}
	}
	if d := apart(apis[0].left, apis[1].left); d > late {
		t.Errorf("level left at least %s apart on the two apis; want the same level", d)
	}
}

// Adaptive concurrency across processes, on real Redis: an upstream that
// takes 2 calls at once answers 429 beyond them; the api (direct path)
// and a consumer (queued path) share one effective limit, which falls
// below CONNECTION_POOL_SIZE and reads the same in both, and every
// request still completes.
func TestAdaptiveLimitSharedByAPIAndConsumer(t *testing.T) {
	t.Parallel()
	sc := fastSim()
	sc.TokenInterval, sc.MaxConcurrency = 20*time.Millisecond, 2
	c := newCluster(t, sc, map[string]string{
		"CONNECTION_POOL_SIZE": "8", "CONNECTION_POOL_PER_USER": "8",
		"ADAPTIVE_CONCURRENCY": "true", "ADAPTIVE_INTERVAL_MS": "200", "LLM_RETRY_AFTER_MAX_SECONDS": "1",
		"QUEUE_FAILOVER_MAX_RETRIES": "20",
	})
	_, url := c.api(nil)
	cons := c.consumer(nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	type result struct {
		text string
		rep  loadtest.Report
	}
	results := make(chan result, 10)
	for i := range 10 {
		text := "adaptive " + string(rune('a'+i))
		go func() {
			resp := postStream(t, ctx, url, prompt(text), nil)
			defer resp.Body.Close()
			results <- result{text, loadtest.StreamCheck{Want: c.want(text)}.Check(resp.Body)}
		}()
	}
	for range 10 {
		select {
		case r := <-results:
			if r.rep.Lost || r.rep.Terminal != protocol.EventDone {
				t.Errorf("request %q: %+v", r.text, r.rep)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("requests did not finish within 60 s")
		}
	}
	if c.sim.Throttled() == 0 {
		t.Fatal("the upstream never answered 429: nothing to adapt to")
	}
	apiMetrics, consMetrics := url+"/metrics", "http://"+cons.addr+"/metrics"
	testutil.Eventually(t, 10*time.Second, func() bool {
		a, b := scrape(t, apiMetrics, "spillway_pool_effective_limit"), scrape(t, consMetrics, "spillway_pool_effective_limit")
		return a == b && a >= 1 && a < 8
	}, "api and consumer reporting one lowered limit")
	if got := scrape(t, apiMetrics, "spillway_pool_slots_capacity"); got != 8 {
		t.Errorf("capacity %v, want CONNECTION_POOL_SIZE", got)
	}
}
