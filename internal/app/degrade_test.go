package app

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testutil"
)

// The degradation level end to end, on real Redis: provider failures
// reported by another process (as a consumer's would be) raise the api's
// level through the cluster-wide last minute; at level 2 a low request is
// refused with 503 queue-overflow and a normal one gets at most
// DEGRADE_MAX_TOKENS chunks while a high one gets its whole answer; at
// level 3 only high is admitted. Each refusal is counted by priority.
func TestDegradationLevelsEndToEnd(t *testing.T) {
	t.Parallel()
	const maxTokens = 3
	c := newCluster(t, fastSim(), map[string]string{"DEGRADE_MAX_TOKENS": "3", "PRIORITY_MAX": "high"})
	_, url := c.api(nil)
	metrics := url + "/metrics"
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	// Another process's view of the provider: its calls go into the same
	// Redis hash the api reads.
	other, err := admission.NewRecent(c.prefix, c.rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	report := func(failed, ok int) {
		for range failed {
			other.ObserveCall(true)
		}
		for range ok {
			other.ObserveCall(false)
		}
		other.Refresh(ctx, time.Now())
	}
	level := func(want float64) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() bool {
			return scrape(t, metrics, "spillway_degradation_level") == want
		}, "degradation level")
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
		return resp.StatusCode, loadtest.CheckStream(resp.Body, nil)
	}

	// 30 % of calls failed: level 2.
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

	// Failures pile up to over half: level 3.
	report(90, 0)
	level(3)
	for _, prio := range []string{"low", "normal"} {
		if code, _ := answer(prio); code != http.StatusServiceUnavailable {
			t.Errorf("%s at level 3: HTTP %d, want 503", prio, code)
		}
	}
	if code, rep := answer("high"); code != http.StatusOK || rep.Terminal != protocol.EventDone || rep.Chunks != c.tokens {
		t.Errorf("high at level 3: HTTP %d, %+v; want all %d chunks", code, rep, c.tokens)
	}
	for prio, want := range map[string]float64{"low": 2, "normal": 1, "high": 0} {
		if got := scrape(t, metrics, `spillway_queue_rejections_total{priority="`+prio+`",reason="degraded"}`); got != want {
			t.Errorf("degraded refusals of %s: %v, want %v", prio, got, want)
		}
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
			results <- result{text, loadtest.CheckStream(resp.Body, c.want(text))}
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
