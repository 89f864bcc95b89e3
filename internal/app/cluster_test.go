package app

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// The pool, resume and stop of api and consumer processes sharing a
// 3-primary Redis Cluster: what every api in a scaled-out deployment
// shares goes through keys spread over the primaries (the pool's under one
// hash tag, each stream's log and cancel key under its request id). The
// rate limiter on a cluster is tested in internal/admission: here, on a
// loaded machine, its designed fallback to per-process limits (a Redis
// call slower than 200ms) would make the cluster-wide count flaky.
func TestSharedStateOnRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	clusterEnv := func(t *testing.T, upstream string, over map[string]string) map[string]string {
		env := scaleoutEnv(t, upstream, map[string]string{
			"REDIS_CLUSTER_ADDRS": strings.Join(cluster.Addrs, ","), "POOL_BACKEND": "redis",
		})
		for k, v := range over {
			env[k] = v
		}
		return env
	}

	// Two apis taking direct slots and a consumer taking queued ones never
	// put more than CONNECTION_POOL_SIZE calls on the provider at once.
	t.Run("pool", func(t *testing.T) {
		t.Parallel()
		const size = 4
		sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 5 * time.Millisecond, Tokens: 16, Seed: 31}
		up := startPeakUpstream(t, sc)
		env := clusterEnv(t, up.url, map[string]string{
			"CONNECTION_POOL_SIZE": fmt.Sprint(size), "CONNECTION_POOL_PER_USER": fmt.Sprint(size),
		})
		a, urlA, _ := startAPI(t, testConfig(t, env))
		_, urlB, _ := startAPI(t, testConfig(t, env))
		startConsumer(t, env)
		var wg sync.WaitGroup
		results := make([]*loadtest.Result, 2)
		for i, url := range []string{urlA, urlB} {
			wg.Go(func() {
				res, err := loadtest.Run(t.Context(), loadtest.Config{
					URL: url + "/v1/stream", Concurrency: 12, Requests: 48, DistinctPrompts: 48,
					Seed: sc.Seed, Tokens: sc.Tokens, Verify: true, UserIDs: 12, Timeout: time.Minute,
				}, nil)
				if err != nil {
					t.Error(err)
				}
				results[i] = res
			})
		}
		wg.Wait()
		paths := map[string]int{}
		for i, res := range results {
			if res == nil {
				t.FailNow()
			}
			if res.Done != 48 || res.Lost != 0 {
				t.Fatalf("api %d: done %d lost %d errors %v refused %d %v", i, res.Done, res.Lost, res.ErrorsByType, res.Refused, res.LostSamples)
			}
			for p, n := range res.Paths {
				paths[p] += n
			}
		}
		if top := up.top.Load(); top > size {
			t.Fatalf("%d provider calls at once, pool of %d", top, size)
		}
		if paths[protocol.PathDirect] == 0 || paths[protocol.PathQueued] == 0 {
			t.Fatalf("paths %v: want both direct and queued streams", paths)
		}
		// A release that timed out on a loaded machine is retried by the
		// next renewal round (every LeaseTTL/3, 10s), and at worst the
		// lease expires (LeaseTTL, 30s).
		testutil.Eventually(t, 40*time.Second, func() bool { return a.pool.Stats().InUse == 0 }, "every slot released")
		t.Logf("peak %d calls on a pool of %d; paths %v", up.top.Load(), size, paths)
	})

	// A stream whose client left is resumed on another api from its log,
	// on both paths.
	t.Run("resume", func(t *testing.T) {
		t.Parallel()
		sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 40 * time.Millisecond, Tokens: 40, Seed: 32}
		_, upstream := startSimllm(t, sc)
		for _, direct := range []bool{true, false} {
			env := clusterEnv(t, upstream, map[string]string{
				"DIRECT_PATH_ENABLED": fmt.Sprint(direct), "CONNECTION_POOL_SIZE": "8", "CONNECTION_POOL_PER_USER": "8",
			})
			_, urlA, _ := startAPI(t, testConfig(t, env))
			_, urlB, _ := startAPI(t, testConfig(t, env))
			want := protocol.PathDirect
			if !direct {
				startConsumer(t, env)
				want = protocol.PathQueued
			}
			q := "resume me on the cluster, " + want
			before, id, path := firstChunks(t, urlA, q, "alice", 5)
			if path != want {
				t.Fatalf("path %q, want %s", path, want)
			}
			resumeRest(t, urlB, id, "alice", before, llm.SimChunks(userMsgs(q), sc.Seed, sc.Tokens))
		}
	})

	// DELETE on one api stops a queued stream another api relays: the
	// notice crosses the cluster, the stream ends stopped, and the worker
	// cancels the provider call.
	t.Run("stop", func(t *testing.T) {
		t.Parallel()
		sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 50 * time.Millisecond, Tokens: 1000, Seed: 33}
		sim, upstream := startSimllm(t, sc)
		env := clusterEnv(t, upstream, map[string]string{"DIRECT_PATH_ENABLED": "false", "STREAM_RESUME_WINDOW_SECONDS": "30"})
		_, urlA, _ := startAPI(t, testConfig(t, env))
		_, urlB, _ := startAPI(t, testConfig(t, env))
		startConsumer(t, env)
		resp := postStream(t, t.Context(), urlA, prompt("stop me on the cluster"), map[string]string{"X-User-ID": "alice"})
		defer resp.Body.Close()
		id := resp.Header.Get("X-Request-ID")
		reportc := make(chan loadtest.Report, 1)
		chunks := make(chan struct{}, 100)
		go func() { reportc <- loadtest.StreamCheck{}.Check(&chunkSignal{r: resp.Body, c: chunks}) }()
		select {
		case <-chunks:
		case <-time.After(20 * time.Second):
			t.Fatal("no chunk within 20s")
		}
		del := streamReq(t, t.Context(), http.MethodDelete, urlB, id, "alice", -1)
		del.Body.Close()
		if del.StatusCode != http.StatusNoContent {
			t.Fatalf("DELETE on the other api: status %d, want 204", del.StatusCode)
		}
		var rep loadtest.Report
		select {
		case rep = <-reportc:
		case <-time.After(10 * time.Second):
			t.Fatal("stream not ended within 10s of the DELETE")
		}
		if rep.Lost || rep.Terminal != protocol.EventError || !strings.HasSuffix(rep.Problem.Type, "/"+protocol.ProblemStopped) {
			t.Fatalf("stopped stream: %+v", rep)
		}
		testutil.Eventually(t, 5*time.Second, func() bool { return sim.Cancelled() == 1 && sim.Active() == 0 }, "provider call cancelled")
	})
}
