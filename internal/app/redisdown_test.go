package app

import (
	"net/http"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Redis stopped mid-run: the pool falls back to its local limit, direct
// requests are still served, readiness says not ready, nothing hangs; once
// Redis is back the pool is distributed again.
func TestRedisDownDirectStillServed(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{"POOL_BACKEND": "redis", "CONNECTION_POOL_SIZE": "4"})
	_, url := c.api(nil)
	// Each stream is its own identity: an identity's idle lease (kept in
	// the api after its stream ended) would serve the next stream of the
	// same one without asking Redis at all, and the pool would not see
	// the outage.
	stream := func(text string) loadtest.Report {
		t.Helper()
		start := time.Now()
		resp := postStream(t, t.Context(), url, prompt(text), map[string]string{"X-User-ID": "user-" + text})
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != protocol.PathDirect {
			t.Fatalf("%s: status %d path %q", text, resp.StatusCode, resp.Header.Get("X-Stream-Path"))
		}
		rep := loadtest.StreamCheck{Want: c.want(text)}.Check(resp.Body)
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("%s took %v", text, took)
		}
		return rep
	}
	if rep := stream("before"); rep.Terminal != protocol.EventDone {
		t.Fatalf("before: %+v", rep)
	}

	c.redis.Stop()
	if rep := stream("during"); rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("during the outage: %+v", rep)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		return scrape(t, url+"/metrics", "spillway_pool_fallback") == 1
	}, "spillway_pool_fallback 1 during the outage")
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	if p := readProblem(t, resp); p.Status != http.StatusServiceUnavailable {
		t.Fatalf("readyz during the outage: %+v", p)
	}

	c.redis.Restart(t)
	testutil.Eventually(t, 10*time.Second, func() bool {
		return scrape(t, url+"/metrics", "spillway_pool_fallback") == 0
	}, "pool back on Redis")
	if rep := stream("after"); rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("after: %+v", rep)
	}
	resp, err = http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz after the outage: %d", resp.StatusCode)
	}
}
