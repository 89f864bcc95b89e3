package app

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/redistest"
	"github.com/spillway-dev/spillway/internal/testutil"
)

// scaleoutEnv is the settings of an api or consumer on a Redis deployment
// other than one REDIS_URL, against the simulated upstream.
func scaleoutEnv(tb testing.TB, upstream string, redisEnv map[string]string) map[string]string {
	env := map[string]string{
		"QUEUE_PREFIX": redistest.Prefix(tb),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": upstream,
		"WORKER_HEARTBEAT_SECONDS": "1", "QUEUE_RECLAIM_IDLE_SECONDS": "2",
		"SHUTDOWN_GRACE_SECONDS": "1", "QUEUE_FAILOVER_BASE_DELAY_MS": "10", "QUEUE_FAILOVER_MAX_DELAY_MS": "50",
		"CONNECTION_POOL_SIZE": "4", "CONNECTION_POOL_PER_USER": "4", "WORKER_CONCURRENCY": "16",
	}
	for k, v := range redisEnv {
		env[k] = v
	}
	return env
}

// TestQueuedOnRedisCluster: two apis sharing the Redis pool and one
// consumer process, all on a 3-primary Redis Cluster, with the queue in
// one and in four streams. 160 concurrent requests over both apis all end
// in done with their own prompt's text, most through the queue (results
// on sharded Pub/Sub channels spread over the three primaries), and the
// queue is empty afterwards.
func TestQueuedOnRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 2 * time.Millisecond, Tokens: 12, Seed: 21}
	_, upstream := startSimllm(t, sc)
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			env := scaleoutEnv(t, upstream, map[string]string{
				"REDIS_CLUSTER_ADDRS": strings.Join(cluster.Addrs, ","),
				"QUEUE_SHARDS":        strconv.Itoa(shards),
				"POOL_BACKEND":        "redis",
			})
			_, urlA, _ := startAPI(t, testConfig(t, env))
			_, urlB, _ := startAPI(t, testConfig(t, env))
			startConsumer(t, env)

			var wg sync.WaitGroup
			results := make([]*loadtest.Result, 2)
			for i, url := range []string{urlA, urlB} {
				wg.Go(func() {
					res, err := loadtest.Run(t.Context(), loadtest.Config{
						URL: url + "/v1/stream", Concurrency: 80, Requests: 80, DistinctPrompts: 80,
						Seed: sc.Seed, Tokens: sc.Tokens, Verify: true,
						UserIDs: 40, Timeout: time.Minute,
					}, nil)
					if err != nil {
						t.Error(err)
					}
					results[i] = res
				})
			}
			wg.Wait()
			queued := 0
			for i, res := range results {
				if res == nil {
					t.FailNow()
				}
				if res.Lost != 0 || res.Done != 80 {
					t.Fatalf("api %d: done %d lost %d errors %v refused %d: %+v",
						i, res.Done, res.Lost, res.ErrorsByType, res.Refused, res.LostSamples)
				}
				queued += res.Paths[protocol.PathQueued]
			}
			// The shared pool has 4 slots for both apis: nearly all of the
			// 160 concurrent streams must have queued.
			if queued < 120 {
				t.Fatalf("only %d of 160 queued: the pool is not shared", queued)
			}
			q, err := redisstream.New(redisstream.Config{Prefix: env["QUEUE_PREFIX"], Consumer: "probe", Shards: shards}, cluster.Client(t))
			if err != nil {
				t.Fatal(err)
			}
			if got := len(q.Streams()); got != shards {
				t.Fatalf("queue has %d streams, want %d", got, shards)
			}
			testutil.Eventually(t, 10*time.Second, func() bool {
				n, err := q.Depth(context.Background())
				return err == nil && n == 0
			}, "queue empty after the load")
		})
	}
}

// TestQueuedSentinelFailover: an api and a consumer process on a
// Sentinel-managed primary; a forced failover in the middle of a load of
// queued streams. Every stream ends in done or an explicit error event or
// refusal (none silently lost), and a new request completes within a few
// seconds of the failover.
func TestQueuedSentinelFailover(t *testing.T) {
	t.Parallel()
	sen := redistest.StartSentinel(t)
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 20 * time.Millisecond, Tokens: 40, Seed: 23}
	_, upstream := startSimllm(t, sc)
	env := scaleoutEnv(t, upstream, map[string]string{
		"REDIS_SENTINEL_ADDRS":  strings.Join(sen.SentinelAddrs, ","),
		"REDIS_SENTINEL_MASTER": sen.MasterName,
	})
	_, url, _ := startAPI(t, testConfig(t, env))
	consumer := startConsumer(t, env)

	var res *loadtest.Result
	var runErr error
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		res, runErr = loadtest.Run(t.Context(), loadtest.Config{
			URL: url + "/v1/stream", Concurrency: 40, Requests: 240, DistinctPrompts: 240,
			Seed: sc.Seed, Tokens: sc.Tokens, Verify: true, UserIDs: 40, Timeout: time.Minute,
		}, nil)
	}()
	// Mid-load: the consumer has finished a few queued jobs.
	testutil.Eventually(t, 30*time.Second, func() bool {
		return consumer.Metric(`spillway_worker_jobs_total{outcome="done"}`) >= 20
	}, "queued jobs running")
	newPrimary := sen.Failover(t)
	failedOver := time.Now()
	t.Logf("failed over to %s", newPrimary)

	// A new request after the failover completes within a few seconds.
	attempts := 0
	testutil.Eventually(t, 10*time.Second, func() bool {
		attempts++
		resp := postStream(t, t.Context(), url, prompt(fmt.Sprint("after failover ", attempts)), nil)
		defer resp.Body.Close()
		rep := loadtest.CheckStream(resp.Body, nil)
		return resp.StatusCode == 200 && rep.Terminal == protocol.EventDone && !rep.Lost
	}, "a request completed after the failover")
	t.Logf("first request after the failover done %v after it (%d attempts)", time.Since(failedOver), attempts)

	<-loadDone
	if runErr != nil {
		t.Fatal(runErr)
	}
	if res.Lost != 0 {
		t.Fatalf("lost %d streams: %v %+v", res.Lost, res.LostByReason, res.LostSamples)
	}
	if res.Done+res.Errors+res.Refused != res.Requests {
		t.Fatalf("done %d + errors %d + refused %d != %d requests", res.Done, res.Errors, res.Refused, res.Requests)
	}
	if res.Paths[protocol.PathQueued] == 0 || res.Done < res.Requests/2 {
		t.Fatalf("done %d of %d, queued %d, errors %v: the queue did not carry on", res.Done, res.Requests,
			res.Paths[protocol.PathQueued], res.ErrorsByType)
	}
	t.Logf("done %d, errors %v, refused %d", res.Done, res.ErrorsByType, res.Refused)
}
