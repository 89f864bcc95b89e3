package app

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// cluster is one test's Redis, simulated upstream, and settings shared by
// the api and the consumers it starts.
type cluster struct {
	tb       testing.TB
	redis    *redistest.Server
	rdb      *redis.Client
	sim      *simserver.Server
	upstream string
	prefix   string
	seed     int64
	tokens   int
	env      map[string]string
}

func newCluster(tb testing.TB, sc llm.SimConfig, extra map[string]string) *cluster {
	tb.Helper()
	c := &cluster{tb: tb, redis: redistest.Start(tb), prefix: redistest.Prefix(tb), seed: sc.Seed, tokens: sc.Tokens}
	c.rdb = c.redis.Client(tb)
	c.sim, c.upstream = startSimllm(tb, sc)
	c.env = map[string]string{
		"REDIS_URL": c.redis.URL(), "QUEUE_PREFIX": c.prefix,
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": c.upstream,
		"WORKER_HEARTBEAT_SECONDS": "1", "QUEUE_RECLAIM_IDLE_SECONDS": "2",
		"SHUTDOWN_GRACE_SECONDS": "1", "QUEUE_FAILOVER_BASE_DELAY_MS": "10", "QUEUE_FAILOVER_MAX_DELAY_MS": "50",
	}
	for k, v := range extra {
		c.env[k] = v
	}
	return c
}

func (c *cluster) with(over map[string]string) map[string]string {
	env := make(map[string]string, len(c.env)+len(over))
	for k, v := range c.env {
		env[k] = v
	}
	for k, v := range over {
		env[k] = v
	}
	return env
}

func (c *cluster) api(over map[string]string) (*API, string) {
	a, url, _ := startAPI(c.tb, testConfig(c.tb, c.with(over)))
	return a, url
}

func (c *cluster) consumer(over map[string]string) *proc {
	return startConsumer(c.tb, c.with(over))
}

func (c *cluster) want(text string) []string {
	return llm.SimChunks(userMsgs(text), c.seed, c.tokens)
}

// backlog is the jobs in the queue over every priority's stream (one
// shard).
func (c *cluster) backlog() int64 {
	var n int64
	for _, p := range protocol.Priorities {
		l, err := c.rdb.XLen(context.Background(), redisstream.PriorityStreamKey(c.prefix, p)).Result()
		if err != nil && err != redis.Nil {
			c.tb.Fatal(err)
		}
		n += l
	}
	return n
}

func (c *cluster) deadLetters() int64 {
	n, err := c.rdb.XLen(context.Background(), redisstream.DeadLetterKey(c.prefix)).Result()
	if err != nil && err != redis.Nil {
		c.tb.Fatal(err)
	}
	return n
}

// 200 concurrent requests against a pool of 4 and two consumer processes:
// every one ends in done with its own prompt's text, most go through the
// queue, and the queue is empty afterwards.
func TestQueuedFloodTwoConsumers(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 2 * time.Millisecond, Tokens: 16, Seed: 3}
	c := newCluster(t, sc, map[string]string{"CONNECTION_POOL_SIZE": "4", "CONNECTION_POOL_PER_USER": "4", "WORKER_CONCURRENCY": "8"})
	_, url := c.api(nil)
	c.consumer(nil)
	c.consumer(nil)

	res, err := loadtest.Run(t.Context(), loadtest.Config{
		URL: url + "/v1/stream", Concurrency: 200, Requests: 200, DistinctPrompts: 200,
		Seed: c.seed, Tokens: c.tokens, Verify: true, UserIDs: 50, Timeout: time.Minute,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lost != 0 || res.Done != 200 {
		t.Fatalf("done %d lost %d errors %v refused %d: %+v", res.Done, res.Lost, res.ErrorsByType, res.Refused, res.LostSamples)
	}
	queued := res.Paths[protocol.PathQueued]
	if queued < 150 {
		t.Fatalf("only %d of 200 queued", queued)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return c.backlog() == 0 }, "stream empty after the flood")
}

// The api subscribes before it enqueues: a worker that publishes the
// instant it reads the job loses nothing.
func TestSubscribeBeforeEnqueue(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), nil)
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	q, err := redisstream.New(redisstream.Config{Prefix: c.prefix, Consumer: "instant", Block: 100 * time.Millisecond}, c.rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { // the instant worker: DONE the moment it reads
		for ctx.Err() == nil {
			ds, _ := q.Fetch(ctx, 64)
			for _, d := range ds {
				job, err := protocol.DecodeJob(d.Body)
				if err != nil {
					t.Error(err)
					continue
				}
				msg, _ := protocol.EncodeResult(protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: 1, Content: job.RequestID}}})
				c.rdb.Publish(ctx, failover.ResultChannel(c.prefix, job.RequestID), msg)
				done, _ := protocol.EncodeResult(protocol.Result{Kind: protocol.KindDone})
				c.rdb.Publish(ctx, failover.ResultChannel(c.prefix, job.RequestID), done)
				_ = q.Ack(ctx, d)
			}
		}
	})
	const n = 300
	var clients sync.WaitGroup
	for i := range n {
		clients.Go(func() {
			// One identity each: QUEUE_MAX_PER_IDENTITY would refuse one
			// identity's 101st queued request.
			resp := postStream(t, t.Context(), url, prompt(fmt.Sprint("instant ", i)), map[string]string{"X-User-ID": fmt.Sprint("instant-", i)})
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: status %d", i, resp.StatusCode)
				return
			}
			id := resp.Header.Get("X-Request-ID")
			rep := loadtest.StreamCheck{Want: []string{id}}.Check(resp.Body)
			if rep.Lost || rep.Terminal != protocol.EventDone {
				t.Errorf("request %d: HTTP %d %+v", i, resp.StatusCode, rep)
			}
		})
	}
	clients.Wait()
}

// Many concurrent queued requests with distinct prompts: each client gets
// only its own text (the original design leaked streams between users).
func TestQueuedIsolation(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond, Tokens: 12, Seed: 11}
	c := newCluster(t, sc, map[string]string{"EMBEDDED_WORKERS": "true", "WORKER_CONCURRENCY": "32",
		"CONNECTION_POOL_SIZE": "32", "CONNECTION_POOL_PER_USER": "32"})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	res, err := loadtest.Run(t.Context(), loadtest.Config{
		URL: url + "/v1/stream", Concurrency: 100, Requests: 300, DistinctPrompts: 300,
		Seed: c.seed, Tokens: c.tokens, Verify: true, Timeout: time.Minute,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lost != 0 || res.Done != 300 || res.Paths[protocol.PathQueued] != 300 {
		t.Fatalf("done %d lost %d samples %+v; errors %v, refused %+v", res.Done, res.Lost, res.LostSamples, res.ErrorsByType, res.RefusedBy)
	}
}

// A consumer killed with SIGKILL mid-job: another takes the job over, the
// client gets reset, then the whole answer and done.
func TestQueuedTakeoverAfterConsumerKilled(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 100 * time.Millisecond, Tokens: 30, Seed: 5}
	c := newCluster(t, sc, nil)
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	first := c.consumer(nil)

	resp := postStream(t, t.Context(), url, prompt("survive a crash"), nil)
	defer resp.Body.Close()
	chunks := make(chan struct{}, 100)
	reportc := make(chan loadtest.Report, 1)
	go func() {
		reportc <- loadtest.StreamCheck{Want: c.want("survive a crash")}.Check(&chunkSignal{r: resp.Body, c: chunks})
	}()
	<-chunks // the first consumer is streaming
	second := c.consumer(nil)
	first.Kill()
	killed := time.Now()
	rep := <-reportc
	if rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("after takeover: %+v", rep)
	}
	if rep.Resets != 1 {
		t.Fatalf("%d resets, want 1", rep.Resets)
	}
	t.Logf("answer completed %v after the kill", time.Since(killed))
	// The worker counts the job once it is acknowledged, just after DONE.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return second.Metric(`spillway_worker_jobs_total{outcome="done"}`) == 1
	}, "second consumer finished the job")
	testutil.Eventually(t, 5*time.Second, func() bool { return c.backlog() == 0 }, "stream empty")
}

// chunkSignal passes reads through and signals each read that carried a
// chunk's data line. Not any line with an id: a queued stream's position
// events carry ids too, and come before any worker has the job (a test
// that kills "the worker streaming" on one would find none streaming). A
// chunk whose line is split between two reads is not signalled; the next
// one is.
type chunkSignal struct {
	r interface{ Read([]byte) (int, error) }
	c chan struct{}
}

func (s *chunkSignal) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if strings.Contains(string(p[:n]), `data: {"content":`) {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
	return n, err
}

// A client that leaves while its job waits: no worker ever runs it.
func TestQueuedDisconnectWhileWaitingSkipsJob(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), nil)
	// Without a resume window a disconnect cancels at once.
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false", "STREAM_RESUME_WINDOW_SECONDS": "0"})
	ctx, cancel := context.WithCancel(t.Context())
	resp := postStream(t, ctx, url, prompt("never mind"), nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != protocol.PathQueued {
		t.Fatalf("status %d path %q", resp.StatusCode, resp.Header.Get("X-Stream-Path"))
	}
	id := resp.Header.Get("X-Request-ID")
	cancel()
	resp.Body.Close()
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, _ := c.rdb.Exists(context.Background(), failover.CancelKey(c.prefix, id)).Result()
		return n == 1
	}, "cancel mark written")
	worker := c.consumer(nil)
	testutil.Eventually(t, 10*time.Second, func() bool { return c.backlog() == 0 }, "job settled")
	if got := worker.Metric(`spillway_worker_jobs_total{outcome="cancelled"}`); got != 1 {
		t.Fatalf("cancelled jobs %v, want 1", got)
	}
	if n := c.sim.Requests(); n != 0 {
		t.Fatalf("the provider was called %d times for an abandoned job", n)
	}
}

// A client that leaves while its job runs: the worker cancels the
// provider call (simllm sees it) and frees its slot within a second.
func TestQueuedDisconnectWhileRunningCancelsUpstream(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 50 * time.Millisecond, Tokens: 1000, Seed: 2}
	c := newCluster(t, sc, nil)
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false", "STREAM_RESUME_WINDOW_SECONDS": "0"})
	worker := c.consumer(nil)
	ctx, cancel := context.WithCancel(t.Context())
	resp := postStream(t, ctx, url, prompt("long"), nil)
	rep := loadtest.StreamCheck{StopAfter: 1}.Check(resp.Body)
	if !rep.Stopped {
		t.Fatalf("no chunk: %+v", rep)
	}
	if got := worker.Metric("spillway_pool_slots_in_use"); got != 1 {
		t.Fatalf("worker slots in use %v, want 1", got)
	}
	left := time.Now()
	cancel()
	resp.Body.Close()
	testutil.Eventually(t, time.Second, func() bool { return c.sim.Cancelled() == 1 }, "upstream cancelled")
	testutil.Eventually(t, time.Second, func() bool { return worker.Metric("spillway_pool_slots_in_use") == 0 }, "slot freed")
	t.Logf("upstream cancelled and slot freed %v after the client left", time.Since(left))
	testutil.Eventually(t, 5*time.Second, func() bool {
		return worker.Metric(`spillway_worker_jobs_total{outcome="cancelled"}`) == 1
	}, "job counted cancelled")
}

// With no worker, the client gets a queue-timeout error at the configured
// time, and a worker arriving later skips the job.
func TestQueueTimeoutWithoutWorkers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{"QUEUE_FAILOVER_TIMEOUT_SECONDS": "1"})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	start := time.Now()
	resp := postStream(t, t.Context(), url, prompt("anyone?"), nil)
	rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
	resp.Body.Close()
	waited := time.Since(start)
	if rep.Lost || rep.Terminal != protocol.EventError || rep.Problem.Slug() != protocol.ProblemQueueTimeout ||
		rep.Problem.RetryAfterSeconds < 1 {
		t.Fatalf("report %+v problem %+v", rep, rep.Problem)
	}
	if waited < time.Second || waited > 10*time.Second {
		t.Fatalf("timed out after %v, want about 1s", waited)
	}
	worker := c.consumer(nil)
	testutil.Eventually(t, 10*time.Second, func() bool { return c.backlog() == 0 }, "job settled")
	skipped := worker.Metric(`spillway_worker_jobs_total{outcome="cancelled"}`) + worker.Metric(`spillway_worker_jobs_total{outcome="expired"}`)
	if skipped != 1 || c.sim.Requests() != 0 {
		t.Fatalf("skipped %v, provider calls %d", skipped, c.sim.Requests())
	}
}

// A provider failing twice then succeeding: two retries in the metrics and
// a clean answer.
func TestQueuedRetriesThenSucceeds(t *testing.T) {
	t.Parallel()
	sc := fastSim()
	sc.FailFirst = 2
	sc.FailStatus = http.StatusBadGateway // a server error: sub-second backoff (a 503 waits 2 s, then 4 s)
	c := newCluster(t, sc, nil)
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	worker := c.consumer(nil)
	resp := postStream(t, t.Context(), url, prompt("flaky"), nil)
	rep := loadtest.StreamCheck{Want: c.want("flaky")}.Check(resp.Body)
	resp.Body.Close()
	if rep.Lost || rep.Terminal != protocol.EventDone || rep.Resets != 0 || rep.Retryings != 2 {
		t.Fatalf("%+v, want done, no reset, two retrying events", rep)
	}
	if got := worker.Metric(`spillway_worker_retries_total{reason="server_error"}`); got != 2 {
		t.Fatalf("retries %v, want 2", got)
	}
	if c.sim.Requests() != 3 {
		t.Fatalf("provider calls %d, want 3", c.sim.Requests())
	}
}

// A provider that always fails: one error event and one dead-letter entry.
func TestQueuedAlwaysFailingDeadLetters(t *testing.T) {
	t.Parallel()
	sc := fastSim()
	sc.FailRate = 1
	sc.FailStatus = http.StatusBadGateway // sub-second backoff
	c := newCluster(t, sc, map[string]string{"QUEUE_FAILOVER_MAX_RETRIES": "2"})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	worker := c.consumer(nil)
	resp := postStream(t, t.Context(), url, prompt("doomed"), nil)
	rep := loadtest.StreamCheck{Want: nil}.Check(resp.Body)
	resp.Body.Close()
	if rep.Lost || rep.Terminal != protocol.EventError || rep.Problem.Slug() != protocol.ProblemProviderError {
		t.Fatalf("%+v", rep)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return c.deadLetters() == 1 && c.backlog() == 0 }, "one dead letter")
	if got := worker.Metric(`spillway_worker_jobs_total{outcome="dead_letter"}`); got != 1 {
		t.Fatalf("dead_letter jobs %v", got)
	}
	if c.sim.Requests() != 3 {
		t.Fatalf("provider calls %d, want 1 + 2 retries", c.sim.Requests())
	}
}

// Garbage on a result channel and in the job stream: no crash, counted,
// and the real answer still arrives.
func TestGarbageIsCountedAndSkipped(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), nil)
	a, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	ctx := t.Context()
	// Garbage job in the stream, before any worker runs.
	if err := c.rdb.XAdd(ctx, &redis.XAddArgs{Stream: redisstream.StreamKey(c.prefix),
		Values: map[string]any{"request_id": "x", "body": "\xff not json"}}).Err(); err != nil {
		t.Fatal(err)
	}
	resp := postStream(t, ctx, url, prompt("through the noise"), nil)
	defer resp.Body.Close()
	id := resp.Header.Get("X-Request-ID")
	for _, junk := range []string{"", "BATCH:[", "SIGNAL:ERROR:{}", "hello", strings.Repeat("x", 1<<21), "BATCH:[{\"seq\":0}]"} {
		if err := c.rdb.Publish(ctx, failover.ResultChannel(c.prefix, id), junk).Err(); err != nil {
			t.Fatal(err)
		}
	}
	worker := c.consumer(nil)
	rep := loadtest.StreamCheck{Want: c.want("through the noise")}.Check(resp.Body)
	if rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("%+v", rep)
	}
	if got := scrape(t, url+"/metrics", `spillway_malformed_messages_total{source="result_channel"}`); got != 6 {
		t.Fatalf("api counted %v malformed results, want 6", got)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		return worker.Metric(`spillway_malformed_messages_total{source="queue"}`) == 1 && c.deadLetters() == 1
	}, "garbage job dead-lettered")
	_ = a
	_ = strconv.Itoa
}
