package app

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
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
		// 160 streams on 4 slots: on a busy 2-core machine draining them
		// can take longer than the default 30 s; the test is about every
		// stream completing, not about speed.
		"QUEUE_FAILOVER_TIMEOUT_SECONDS": "120",
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

// TestWatchPrimarySwitch: a forced Sentinel failover is reported with the
// new primary's address, which is what the api resets its result
// subscriptions on.
func TestWatchPrimarySwitch(t *testing.T) {
	t.Parallel()
	sen := redistest.StartSentinel(t)
	cfg := testConfig(t, map[string]string{
		"REDIS_SENTINEL_ADDRS":  strings.Join(sen.SentinelAddrs, ","),
		"REDIS_SENTINEL_MASTER": sen.MasterName,
	})
	switched := make(chan string, 4)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		WatchPrimarySwitch(ctx, cfg, testLog(t), func(addr string) { switched <- addr })
	}()
	defer func() { cancel(); <-done }()
	// The watch subscribes in the background; a failover forced before it
	// listens would go unseen, so wait until a sentinel counts a listener.
	testutil.Eventually(t, 10*time.Second, func() bool {
		for _, addr := range sen.SentinelAddrs {
			c := redis.NewClient(&redis.Options{Addr: addr})
			list, err := c.ClientList(context.Background()).Result()
			_ = c.Close()
			// A client in subscriber state (flag P). No go-redis failover
			// client exists in this test, so any subscriber is the watch.
			if err == nil && strings.Contains(list, "flags=P ") {
				return true
			}
		}
		return false
	}, "watch subscribed on a sentinel")
	newPrimary := sen.Failover(t)
	select {
	case got := <-switched:
		if got != newPrimary {
			t.Fatalf("switch reported to %s, want %s", got, newPrimary)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no switch reported within 20s of the failover")
	}

	// Outside Sentinel mode it returns at once.
	WatchPrimarySwitch(t.Context(), testConfig(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}), testLog(t), func(string) {
		t.Error("switch reported outside Sentinel mode")
	})
}

// TestQueuedThroughSentinelFailover: an api and two consumer processes on
// a Sentinel-managed Redis, every request on the queued path, and the
// primary fails over while streams flow. Every stream ends in done with
// its own prompt's whole answer in order, or in an explicit error event;
// none breaks the contract (a missing, repeated or reordered id, a wrong
// answer, no terminal event). New requests complete within a few seconds
// of the switch, and afterwards the pool and the queue are empty.
func TestQueuedThroughSentinelFailover(t *testing.T) {
	t.Parallel()
	sen := redistest.StartSentinel(t)
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 15 * time.Millisecond, Tokens: 40, Seed: 23}
	_, upstream := startSimllm(t, sc)
	env := scaleoutEnv(t, upstream, map[string]string{
		"REDIS_SENTINEL_ADDRS":  strings.Join(sen.SentinelAddrs, ","),
		"REDIS_SENTINEL_MASTER": sen.MasterName,
		"DIRECT_PATH_ENABLED":   "false", "POOL_BACKEND": "redis",
		"CONNECTION_POOL_SIZE": "16", "CONNECTION_POOL_PER_USER": "16", "WORKER_CONCURRENCY": "8",
		"QUEUE_FAILOVER_TIMEOUT_SECONDS": "60",
	})
	a, url, _ := startAPI(t, testConfig(t, env))
	startConsumer(t, env)
	startConsumer(t, env)
	run := func(ctx context.Context, requests int, progress func(loadtest.Snapshot)) *loadtest.Result {
		t.Helper()
		res, err := loadtest.Run(ctx, loadtest.Config{
			URL: url + "/v1/stream", Concurrency: 24, Requests: requests, DistinctPrompts: 100,
			Seed: sc.Seed, Tokens: sc.Tokens, Verify: true, UserIDs: 24, Timeout: time.Minute,
		}, progress)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	underway := make(chan struct{})
	var once sync.Once
	loaded := make(chan *loadtest.Result, 1)
	go func() {
		loaded <- run(t.Context(), 400, func(s loadtest.Snapshot) {
			if s.Done >= 60 {
				once.Do(func() { close(underway) })
			}
		})
	}()
	select {
	case <-underway:
	case res := <-loaded:
		t.Fatalf("the load ended before the failover: %+v", res)
	case <-time.After(60 * time.Second):
		t.Fatal("60 streams not done within 60s before the failover")
	}
	sen.Failover(t)
	switched := time.Now()
	// New requests succeed within a few seconds of the switch.
	testutil.Eventually(t, 30*time.Second, func() bool {
		res := run(t.Context(), 4, nil)
		return res.Done == 4
	}, "4 new requests done after the failover")
	took := time.Since(switched)
	t.Logf("new requests done %v after the switch", took.Round(time.Millisecond))
	// A pool slot whose release failed on the demoted primary must not
	// stay taken until its lease expires (30s): every slot would be.
	if took > 10*time.Second {
		t.Errorf("new requests done %v after the switch, want a few seconds", took)
	}

	res := <-loaded
	t.Logf("through the failover: done %d, errors %v, refused %d %v, lost %d",
		res.Done, res.ErrorsByType, res.Refused, res.RefusedBy, res.Lost)
	if res.Lost != 0 {
		t.Fatalf("%d streams broke the contract: %v %v", res.Lost, res.LostByReason, res.LostSamples)
	}
	if res.Done+res.Errors+res.Refused != res.Requests {
		t.Fatalf("%d requests, %d done, %d errors, %d refused: some ended otherwise", res.Requests, res.Done, res.Errors, res.Refused)
	}
	if res.Done < res.Requests/2 {
		t.Fatalf("only %d of %d streams done: the failover cost more than the streams under way", res.Done, res.Requests)
	}
	// After the failover the path works as before.
	after := run(t.Context(), 100, nil)
	if after.Done != 100 {
		t.Fatalf("after the failover: done %d errors %v refused %d lost %d %v",
			after.Done, after.ErrorsByType, after.Refused, after.Lost, after.LostSamples)
	}
	q, err := redisstream.New(redisstream.Config{Prefix: env["QUEUE_PREFIX"], Consumer: "probe"}, sen.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	// A release that timed out is retried by the next renewal round
	// (every 10s); none may wait for its lease to expire after a failover.
	testutil.Eventually(t, 25*time.Second, func() bool {
		n, err := q.Depth(context.Background())
		return err == nil && n == 0 && a.pool.Stats().InUse == 0
	}, "queue empty and every pool slot released")
}
