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

// The noisy-neighbour scenario of docs/QUEUE.md, "Fairness", scaled down:
// a pool of 20 with 2 per identity, two consumer processes with one worker
// each, 8 s queue timeout, answers of about 2 s. alice sends 16 requests
// at 8/s; 0.75 s in, bob sends one. The property guaranteed: a job whose
// identity is at its per-user limit holds no worker slot and no place in
// line, so bob's request starts within one provider first-token time plus
// scheduling, on either path, however large alice's backlog; every one of
// alice's streams still ends in done or an explicit error.
//
// queued: bob's request goes to an api whose direct path is off, so his
// job lands in the queue behind alice's: the consumers must reach past
// alice's jobs (parked behind her limit) to start it. direct: bob's
// request goes to alice's api and must not be sent behind her backlog.
func TestNoisyNeighbour(t *testing.T) {
	t.Parallel()
	for _, path := range []string{protocol.PathQueued, protocol.PathDirect} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			noisyNeighbour(t, path)
		})
	}
}

func noisyNeighbour(t *testing.T, bobPath string) {
	sc := llm.SimConfig{FirstToken: 20 * time.Millisecond, TokenInterval: 100 * time.Millisecond, Tokens: 20, Seed: 11}
	c := newCluster(t, sc, map[string]string{
		"POOL_BACKEND": "redis", "CONNECTION_POOL_SIZE": "20", "CONNECTION_POOL_PER_USER": "2",
		"WORKER_CONCURRENCY": "1", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "8",
		"QUEUE_DEPTH_CACHE_TTL_MS": "50",
	})
	_, aliceURL := c.api(nil)
	bobURL := aliceURL
	if bobPath == protocol.PathQueued {
		_, bobURL = c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	}
	c.consumer(nil)
	c.consumer(nil)

	type result struct {
		path string
		sent time.Time
		rep  loadtest.Report
	}
	var mu sync.Mutex
	alice := map[int]result{}
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(125 * time.Millisecond) // 8/s
	defer tick.Stop()
	var bob result
	var bobStarted time.Time
	for i := range 16 {
		if i > 0 {
			<-tick.C
		}
		if i == 6 { // 0.75 s in: alice at her limit, her backlog parked
			name := "bob"
			bobStarted = time.Now()
			resp := postStream(t, t.Context(), bobURL, prompt(name), map[string]string{"X-User-ID": "bob"})
			wg.Go(func() {
				defer resp.Body.Close()
				rep := loadtest.StreamCheck{Want: c.want(name), Start: bobStarted}.Check(resp.Body)
				mu.Lock()
				bob = result{resp.Header.Get("X-Stream-Path"), bobStarted, rep}
				mu.Unlock()
			})
		}
		name := "alice " + strconv.Itoa(i)
		sent := time.Now()
		resp := postStream(t, t.Context(), aliceURL, prompt(name), map[string]string{"X-User-ID": "alice"})
		wg.Go(func() {
			defer resp.Body.Close()
			rep := loadtest.StreamCheck{Want: c.want(name), Start: sent}.Check(resp.Body)
			mu.Lock()
			alice[i] = result{resp.Header.Get("X-Stream-Path"), sent, rep}
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("scenario took %v", time.Since(start))

	if bob.rep.Terminal != protocol.EventDone || bob.rep.Lost {
		t.Fatalf("bob: %+v", bob.rep)
	}
	if bob.path != bobPath {
		t.Errorf("bob went %s, want %s", bob.path, bobPath)
	}
	if bob.rep.FirstChunk > 1500*time.Millisecond {
		t.Errorf("bob's first chunk after %v, want within 1.5s", bob.rep.FirstChunk)
	}
	// bob really came while alice had work waiting: some of alice's
	// earlier requests started only after him.
	bobFirst := bobStarted.Add(bob.rep.FirstChunk)
	var queued, after, done, errored int
	for i := range 16 {
		r, ok := alice[i]
		if !ok {
			t.Fatalf("alice %d: no result", i)
		}
		switch {
		case r.rep.Lost:
			t.Errorf("alice %d lost: %+v", i, r.rep)
		case r.rep.Terminal == protocol.EventDone:
			done++
		case r.rep.Terminal == protocol.EventError && r.rep.Problem != nil:
			errored++
		default:
			t.Errorf("alice %d ended without done or an explicit error: %+v", i, r.rep)
		}
		if r.path == protocol.PathQueued {
			queued++
		}
		if i < 6 && r.rep.Terminal == protocol.EventDone {
			if r.sent.Add(r.rep.FirstChunk).After(bobFirst) {
				after++
			}
		}
	}
	t.Logf("alice: %d done, %d errors, %d queued; %d of her earlier requests started after bob (%v)", done, errored, queued, after, bob.rep.FirstChunk)
	if after == 0 {
		t.Errorf("none of alice's requests sent before bob started after him: bob was not served past her backlog (or none built up)")
	}
	if done < 4 {
		t.Errorf("only %d of alice's requests done", done)
	}
}
