package app

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Over the queue threshold new queued requests get 503 queue-overflow with
// Retry-After; the ones accepted before are still answered.
func TestQueueOverflowRefusesAndKeepsAccepted(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{
		"QUEUE_OVERFLOW_THRESHOLD": "3", "QUEUE_OVERFLOW_HYSTERESIS": "1", "QUEUE_DEPTH_CACHE_TTL_MS": "20",
		"QUEUE_RETRY_AFTER_SECONDS": "7",
	})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var accepted []*http.Response
	for i := range 3 {
		resp := postStream(t, ctx, url, prompt("wait "+strconv.Itoa(i)), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		accepted = append(accepted, resp)
	}
	// The gate reads a cached depth: wait until it has seen the backlog.
	var refused *http.Response
	testutil.Eventually(t, 5*time.Second, func() bool {
		resp := postStream(t, ctx, url, prompt("one more"), nil)
		if resp.StatusCode == http.StatusOK {
			accepted = append(accepted, resp)
			return false
		}
		refused = resp
		return true
	}, "overflow refusal")
	ra, _ := strconv.Atoi(refused.Header.Get("Retry-After"))
	p := readProblem(t, refused)
	if p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemQueueOverflow || ra < 1 || ra > 7 {
		t.Fatalf("problem %+v Retry-After %d", p, ra)
	}
	if got := scrape(t, url+"/metrics", `spillway_queue_rejections_total{priority="normal",reason="overflow"}`); got < 1 {
		t.Fatalf("overflow rejections %v", got)
	}
	// A worker drains the backlog: everything accepted completes.
	c.consumer(nil)
	for i, resp := range accepted {
		text := "wait " + strconv.Itoa(i)
		if i >= 3 {
			text = "one more"
		}
		rep := loadtest.StreamCheck{Want: c.want(text)}.Check(resp.Body)
		resp.Body.Close()
		if rep.Lost || rep.Terminal != protocol.EventDone {
			t.Fatalf("accepted request %d: %+v", i, rep)
		}
	}
	// Below threshold − hysteresis the gate accepts again.
	testutil.Eventually(t, 5*time.Second, func() bool {
		resp := postStream(t, ctx, url, prompt("after drain"), nil)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		return loadtest.StreamCheck{Want: nil}.Check(resp.Body).Terminal == protocol.EventDone
	}, "accepting after the backlog drained")
}

// Per identity GCRA: a burst is allowed, then 429 with Retry-After, and
// another identity is unaffected.
func TestRateLimit429(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{"RATE_LIMIT_RPS": "0.5", "RATE_LIMIT_BURST": "2"})
	_, url := c.api(nil)
	for i := range 2 {
		resp := postStream(t, t.Context(), url, prompt("hi"), map[string]string{"X-User-ID": "alice"})
		rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || rep.Terminal != protocol.EventDone {
			t.Fatalf("burst request %d: %d %+v", i, resp.StatusCode, rep)
		}
	}
	resp := postStream(t, t.Context(), url, prompt("hi"), map[string]string{"X-User-ID": "alice"})
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	p := readProblem(t, resp)
	if p.Status != http.StatusTooManyRequests || p.Slug() != protocol.ProblemRateLimited || ra < 1 || ra > 2 {
		t.Fatalf("problem %+v Retry-After %d", p, ra)
	}
	other := postStream(t, t.Context(), url, prompt("hi"), map[string]string{"X-User-ID": "bob"})
	other.Body.Close()
	if other.StatusCode != http.StatusOK {
		t.Fatalf("bob limited by alice's use: %d", other.StatusCode)
	}
	if got := scrape(t, url+"/metrics", "spillway_rate_limited_total"); got != 1 {
		t.Fatalf("rate limited %v, want 1", got)
	}
}

// A provider that keeps failing opens the circuit: new requests fail fast
// with 503 provider-unavailable, and none of them is queued.
func TestCircuitOpenFailsFastAndQueueStaysEmpty(t *testing.T) {
	t.Parallel()
	sc := fastSim()
	sc.FailRate = 1
	c := newCluster(t, sc, map[string]string{"CONNECTION_POOL_SIZE": "1", "CONNECTION_POOL_PER_USER": "1"})
	// Without a queue the direct failures end with an error event (with
	// one they would be handed to the queue, which has no worker here).
	_, url := c.api(map[string]string{"QUEUE_FAILOVER_ENABLED": "false"})
	// Five consecutive failures open it (BREAKER_FAILURES).
	for i := range 5 {
		resp := postStream(t, t.Context(), url, prompt("fail"), nil)
		rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
		resp.Body.Close()
		if rep.Terminal != protocol.EventError {
			t.Fatalf("failure %d: %+v", i, rep)
		}
	}
	calls := c.sim.Requests()
	for range 10 {
		resp := postStream(t, t.Context(), url, prompt("fail"), nil)
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		p := readProblem(t, resp)
		if p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemProviderUnavailable || ra < 1 {
			t.Fatalf("problem %+v Retry-After %d", p, ra)
		}
	}
	if c.sim.Requests() != calls {
		t.Fatalf("provider called %d more times while open", c.sim.Requests()-calls)
	}
	if c.backlog() != 0 {
		t.Fatalf("%d jobs queued while the circuit was open", c.backlog())
	}
	if got := scrape(t, url+"/metrics", `spillway_circuit_state{provider="openai"}`); got != 2 {
		t.Fatalf("circuit state %v, want 2 (open)", got)
	}
}
