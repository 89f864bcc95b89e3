package app

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// With the pool saturated and a backlog built, queued jobs start in the
// order they arrived, and a later request queues behind them instead of
// taking a freed slot directly.
func TestQueuedJobsAreNotStarved(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 15 * time.Millisecond, Tokens: 20, Seed: 4}
	c := newCluster(t, sc, map[string]string{
		"POOL_BACKEND": "redis", "CONNECTION_POOL_SIZE": "2", "CONNECTION_POOL_PER_USER": "10",
		"QUEUE_DEPTH_CACHE_TTL_MS": "10",
	})
	_, url := c.api(nil)
	c.consumer(nil)

	type result struct {
		path  string
		first time.Time
		rep   loadtest.Report
	}
	var mu sync.Mutex
	results := map[string]result{}
	var wg sync.WaitGroup
	send := func(name string) {
		resp := postStream(t, t.Context(), url, prompt(name), nil)
		wg.Go(func() {
			defer resp.Body.Close()
			sent := time.Now()
			rep := loadtest.StreamCheck{Want: c.want(name), Start: sent}.Check(resp.Body)
			mu.Lock()
			results[name] = result{path: resp.Header.Get("X-Stream-Path"), first: sent.Add(rep.FirstChunk), rep: rep}
			mu.Unlock()
		})
	}
	send("direct 0")
	send("direct 1")
	for i := range 4 {
		send("queued " + strconv.Itoa(i))
	}
	send("late")
	wg.Wait()

	for name, r := range results {
		if r.rep.Lost || r.rep.Terminal != protocol.EventDone {
			t.Fatalf("%s: %+v", name, r.rep)
		}
	}
	for _, name := range []string{"direct 0", "direct 1"} {
		if results[name].path != protocol.PathDirect {
			t.Fatalf("%s went %s", name, results[name].path)
		}
	}
	if p := results["late"].path; p != protocol.PathQueued {
		t.Fatalf("the late request went %s while jobs waited: it jumped the queue", p)
	}
	// Two slots, 300ms answers: FIFO serves the queue in generations of
	// two, each about one answer after the one before. A job served out of
	// order would land a generation early.
	generations := [][]string{{"queued 0", "queued 1"}, {"queued 2", "queued 3"}, {"late"}}
	for g := 1; g < len(generations); g++ {
		for _, earlier := range generations[g-1] {
			for _, later := range generations[g] {
				a, b := results[earlier], results[later]
				if a.path != protocol.PathQueued || b.path != protocol.PathQueued {
					t.Fatalf("%s went %s, %s went %s", earlier, a.path, later, b.path)
				}
				if gap := b.first.Sub(a.first); gap < 150*time.Millisecond {
					t.Fatalf("%s started %v after %s, which was queued before it: not FIFO", later, gap, earlier)
				}
			}
		}
	}
	if got := scrape(t, url+"/metrics", "spillway_pool_slots_capacity"); got != 2 {
		t.Fatalf("capacity %v", got)
	}
}
