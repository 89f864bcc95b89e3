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

// degradeState is what an api's /metrics says of its degradation level.
type degradeState struct {
	level, errorRate, latestRate, requests, backlog float64
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
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
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
// raises level 3 at once (well within the failure rate's 10 s), on both
// apis, which then refuse normal requests but one in DEGRADE_PROBE_EVERY.
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
	testutil.Eventually(t, 10*time.Second, func() bool {
		return scrape(t, url+"/metrics", "spillway_degradation_level") == 3 &&
			scrape(t, url2+"/metrics", "spillway_degradation_level") == 3
	}, "level 3 on both apis")
	took := time.Since(queued)
	if took >= admission.DegradeRaiseAfter/2 {
		t.Errorf("level 3 %s after the backlog reached 80 %%; want at once (a depth refresh and a step)", took)
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
	t.Logf("level 3 %s after the backlog reached 80 %%", took.Round(time.Millisecond))
}

// commandUpstream is a simllm upstream that misbehaves on command: the
// next stall calls fall silent after their first chunk until the caller
// gives up, and while fail is set, a call whose last message starts with
// "fail" is answered 500.
type commandUpstream struct {
	url       string
	ok, stuck *simserver.Server
	stall     atomic.Int32
	fail      atomic.Bool
	failed    atomic.Int64
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
		case u.fail.Load() && strings.Contains(string(body), `"content":"fail`):
			u.failed.Add(1)
			http.Error(w, `{"error":{"message":"on command","type":"server_error"}}`, http.StatusInternalServerError)
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
// request of one, and nobody is refused for it, neither right after it
// nor in the next thirty requests (the issue this rule came from refused
// every normal request for 87 s).
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
// count as failures: nobody is refused for degradation.
func TestDegradationIgnoresA429Burst(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: 10, Seed: 42,
		MaxConcurrency: 4, FailRetryAfter: time.Second}
	sim, upstream := startSimllm(t, sc)
	_, url, _ := startAPI(t, testConfig(t, degradeEnv(t, upstream, nil)))

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
	if s.level != 0 || s.errorRate != 0 {
		t.Errorf("level %v, failure rate %v after a burst the adaptive limit absorbed; want 0 and 0", s.level, s.errorRate)
	}
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

// sample is one reading of both apis' degradation state.
type sample struct {
	at   time.Time
	a, b degradeState
}

// A real, sustained failure, on two apis with the level's times scaled
// down five times (a 12 s window, 2 s to raise, 6 s to leave): a third
// of the requests fail for a window's time, over 40 of them (not half:
// every queued request is one call, and half the calls failing would open
// the circuit breaker, another mechanism; each client's third request
// fails, so no stretch of calls reaches half). The level rises no sooner than
// the raise delay after the failure rate crossed a threshold, the same on
// both apis, never to 3, and is left the hold after the failure input
// stopped counting, soon after the failure ended although the minute
// still holds its failures. Nobody asking normal is refused meanwhile.
func TestDegradationFollowsASustainedFailure(t *testing.T) {
	t.Parallel()
	times := DegradeTimes{Window: 12 * time.Second, RaiseAfter: 2 * time.Second, Hold: 6 * time.Second}
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 2 * time.Millisecond, Tokens: 8, Seed: 44}
	up := startCommandUpstream(t, sc)
	env := degradeEnv(t, up.url, map[string]string{
		"BREAKER_FAILURES": "100000", "DIRECT_PATH_ENABLED": "false", "QUEUE_FAILOVER_MAX_RETRIES": "0",
	})
	_, urlA, _ := startAPIWith(t, testConfig(t, env), Options{DegradeTimes: times})
	_, urlB, _ := startAPIWith(t, testConfig(t, env), Options{DegradeTimes: times})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		mu      sync.Mutex
		samples []sample
		results = map[string]int{}
		load    sync.WaitGroup
	)
	load.Go(func() {
		for ctx.Err() == nil {
			a, errA := readDegrade(urlA)
			b, errB := readDegrade(urlB)
			if errA == nil && errB == nil {
				mu.Lock()
				samples = append(samples, sample{time.Now(), a, b})
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	for c := range 4 {
		load.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				url, text := urlA, fmt.Sprint("ok ", c, " ", i)
				if c%2 == 1 {
					url = urlB
				}
				if i%3 == 2 {
					text = fmt.Sprint("fail ", c, " ", i)
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
				mu.Lock()
				results[outcome]++
				mu.Unlock()
			}
		})
	}
	series := func() []sample {
		mu.Lock()
		defer mu.Unlock()
		return append([]sample(nil), samples...)
	}

	// The failure, for a window's time.
	up.fail.Store(true)
	failFrom := time.Now()
	testutil.Eventually(t, 30*time.Second, func() bool {
		s := series()
		return len(s) > 0 && s[len(s)-1].a.level == 2 && s[len(s)-1].b.level == 2
	}, "level 2 on both apis")
	if wait := times.Window - time.Since(failFrom); wait > 0 {
		<-time.After(wait) // the failure's length, not a wait for a condition
	}
	up.fail.Store(false)
	failTo := time.Now()
	testutil.Eventually(t, 60*time.Second, func() bool {
		s := series()
		return len(s) > 0 && s[len(s)-1].at.After(failTo) && s[len(s)-1].a.level == 0 && s[len(s)-1].b.level == 0
	}, "level 0 on both apis after the failure")
	cancel()
	load.Wait()

	s := series()
	// When the api first saw the rate at or above 5 % and 20 % (of
	// enough requests), when it raised levels 1 and 2, when the failure
	// input stopped counting after the failure (under 5 %, or too few
	// requests), and when it left the last level.
	var crossed5, crossed, raised1, raised, below, left time.Time
	for _, x := range s {
		for _, d := range []degradeState{x.a, x.b} {
			if d.level == 3 {
				t.Fatalf("level 3 at %s: failures alone must not reach it", x.at.Sub(failFrom))
			}
		}
		enough := x.a.requests >= admission.DefaultDegradeMinRequests
		if crossed5.IsZero() && x.a.errorRate >= 0.05 && enough {
			crossed5 = x.at
		}
		if crossed.IsZero() && x.a.errorRate >= 0.2 && enough {
			crossed = x.at
		}
		if raised1.IsZero() && x.a.level >= 1 {
			raised1 = x.at
		}
		if raised.IsZero() && x.a.level >= 2 {
			raised = x.at
		}
		if x.at.After(failTo) && below.IsZero() && (x.a.errorRate < 0.05 || x.a.latestRate < 0.05 || !enough) {
			below = x.at
		}
		if !below.IsZero() && left.IsZero() && x.a.level == 0 {
			left = x.at
		}
	}
	mu.Lock()
	failed := results["error "+protocol.ProblemProviderError]
	t.Logf("outcomes %v; failed calls %d; from the failure's start: rate over 5 %% at %s, level 1 at %s, rate over 20 %% at %s, level 2 at %s; failure ended at %s, input below at %s, level 0 at %s",
		results, up.failed.Load(), crossed5.Sub(failFrom), raised1.Sub(failFrom), crossed.Sub(failFrom), raised.Sub(failFrom),
		failTo.Sub(failFrom), below.Sub(failFrom), left.Sub(failFrom))
	for k, n := range results {
		if strings.HasPrefix(k, "refused") || k == "transport" {
			t.Errorf("%d requests %s; want none refused", n, k)
		}
	}
	mu.Unlock()
	if failed < 40 {
		t.Errorf("%d requests failed during the failure; want at least 40", failed)
	}
	if crossed5.IsZero() || crossed.IsZero() || raised1.IsZero() || raised.IsZero() || below.IsZero() || left.IsZero() {
		t.Fatal("a moment is missing from the series")
	}
	// The sampling is every 100 ms; the level steps every second.
	const slack = 300 * time.Millisecond
	if d := raised1.Sub(crossed5); d < times.RaiseAfter-slack || d > times.RaiseAfter+2*time.Second {
		t.Errorf("level 1 raised %s after the rate crossed 5 %%; want the raise delay, %s", d, times.RaiseAfter)
	}
	if d := raised.Sub(crossed); d < times.RaiseAfter-slack || d > times.RaiseAfter+2*time.Second {
		t.Errorf("level 2 raised %s after the rate crossed 20 %%; want the raise delay, %s", d, times.RaiseAfter)
	}
	if d := left.Sub(below); d < times.Hold-time.Second-slack || d > times.Hold+2*time.Second {
		t.Errorf("level left %s after the failure input stopped counting; want the hold, %s", d, times.Hold)
	}
	// The failures still weigh on the minute, but its latest seconds
	// (a sixth of the window) show the recovery: the level is left about
	// the hold after the failure ended, not once the minute emptied.
	if d := left.Sub(failTo); d > times.Hold+times.Window/6+3*time.Second {
		t.Errorf("level left %s after the failure ended; want within the hold and the latest seconds, %s", d, times.Hold+times.Window/6)
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
