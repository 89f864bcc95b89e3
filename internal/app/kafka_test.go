package app

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/kafkatest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// kafkaCluster is a cluster whose queue is a real Kafka-protocol broker
// (kfake, in this test process) while results still flow through Redis.
func kafkaCluster(tb testing.TB, sc llm.SimConfig, extra map[string]string) (*cluster, *kafkatest.Cluster) {
	tb.Helper()
	k := kafkatest.Start(tb)
	// A Kafka takeover waits for the group session (6s) and the claim TTL
	// (QUEUE_RECLAIM_IDLE_SECONDS); the api waits 3 heartbeats + reclaim +
	// 3 heartbeats of silence (15s here) before calling a worker lost.
	env := map[string]string{"QUEUE_TYPE": "kafka", "KAFKA_BROKERS": strings.Join(k.Brokers, ","),
		"WORKER_HEARTBEAT_SECONDS": "2", "QUEUE_RECLAIM_IDLE_SECONDS": "3"}
	for key, v := range extra {
		env[key] = v
	}
	return newCluster(tb, sc, env), k
}

// A flood through the api and two consumer processes over Kafka: every
// stream completes with its own text, most of them queued.
func TestKafkaFloodTwoConsumers(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 2 * time.Millisecond, Tokens: 12, Seed: 8}
	c, _ := kafkaCluster(t, sc, map[string]string{"CONNECTION_POOL_SIZE": "4", "CONNECTION_POOL_PER_USER": "4"})
	_, url := c.api(nil)
	c.consumer(nil)
	c.consumer(nil)
	res, err := loadtest.Run(t.Context(), loadtest.Config{
		URL: url + "/v1/stream", Concurrency: 100, Requests: 200, DistinctPrompts: 200,
		Seed: c.seed, Tokens: c.tokens, Verify: true, UserIDs: 50, Timeout: 2 * time.Minute,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Lost != 0 || res.Done != 200 {
		t.Fatalf("done %d lost %d errors %v refused %d: %+v", res.Done, res.Lost, res.ErrorsByType, res.Refused, res.LostSamples)
	}
	if q := res.Paths[protocol.PathQueued]; q < 100 {
		t.Fatalf("only %d of 200 queued", q)
	}
}

// A consumer killed mid-job over Kafka: the job is redelivered to the
// other member, which sends reset and the whole answer.
func TestKafkaTakeoverAfterConsumerKilled(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 100 * time.Millisecond, Tokens: 30, Seed: 6}
	c, _ := kafkaCluster(t, sc, nil)
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	first := c.consumer(nil)
	second := c.consumer(nil)

	text := "survive a crash on kafka"
	resp := postStream(t, t.Context(), url, prompt(text), nil)
	defer resp.Body.Close()
	chunks := make(chan struct{}, 100)
	reportc := make(chan loadtest.Report, 1)
	go func() {
		reportc <- loadtest.StreamCheck{Want: c.want(text)}.Check(&chunkSignal{r: resp.Body, c: chunks})
	}()
	<-chunks
	// Kill whichever consumer is answering.
	victim, survivor := first, second
	if second.Metric("spillway_pool_slots_in_use") > 0 || first.Metric("spillway_pool_slots_in_use") == 0 {
		victim, survivor = second, first
	}
	victim.Kill()
	killed := time.Now()
	rep := <-reportc
	if rep.Lost || rep.Terminal != protocol.EventDone || rep.Resets != 1 {
		t.Fatalf("after takeover: %+v", rep)
	}
	t.Logf("answer completed %v after the kill", time.Since(killed))
	testutil.Eventually(t, 5*time.Second, func() bool {
		return survivor.Metric(`spillway_worker_jobs_total{outcome="done"}`) == 1
	}, "the surviving consumer finished the job")
}

// Over Kafka too the backlog (the group's lag) drives the overflow gate.
func TestKafkaLagOverThresholdRefuses(t *testing.T) {
	t.Parallel()
	c, _ := kafkaCluster(t, fastSim(), map[string]string{
		"QUEUE_OVERFLOW_THRESHOLD": "3", "QUEUE_OVERFLOW_HYSTERESIS": "1", "QUEUE_DEPTH_CACHE_TTL_MS": "20",
	})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for i := range 3 {
		resp := postStream(t, ctx, url, prompt("lag "+strconv.Itoa(i)), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		defer resp.Body.Close()
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		resp := postStream(t, ctx, url, prompt("one more"), nil)
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return false
		}
		p := readProblem(t, resp)
		if p.Slug() != protocol.ProblemQueueOverflow || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("refusal %+v", p)
		}
		return true
	}, "overflow refusal from Kafka lag")
}

// With the broker gone, a request that must queue gets an explicit 503
// promptly, and the api keeps serving direct requests.
func TestKafkaBrokerDownRefusesQueuedServesDirect(t *testing.T) {
	t.Parallel()
	sc := fastSim()
	sc.TokenInterval = 50 * time.Millisecond // the first stream holds the only slot for over a second
	c, k := kafkaCluster(t, sc, map[string]string{"CONNECTION_POOL_SIZE": "1", "CONNECTION_POOL_PER_USER": "1"})
	_, url := c.api(nil)
	k.Stop()

	// The pool of 1 is held by a long direct stream; the next request must queue.
	slowCtx, cancel := context.WithCancel(t.Context())
	defer cancel()
	slow := postStream(t, slowCtx, url, prompt("hold the slot"), map[string]string{"X-User-ID": "a"})
	defer slow.Body.Close()
	if slow.StatusCode != http.StatusOK {
		t.Fatalf("direct: %d", slow.StatusCode)
	}
	start := time.Now()
	resp := postStream(t, t.Context(), url, prompt("needs the queue"), map[string]string{"X-User-ID": "b"})
	took := time.Since(start)
	p := readProblem(t, resp)
	if p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemQueueUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("refusal %+v", p)
	}
	if took > 10*time.Second {
		t.Fatalf("refusal took %v", took)
	}
	t.Logf("queue-unavailable refusal after %v", took)
	rep := loadtest.StreamCheck{Want: nil}.Check(slow.Body)
	if rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("direct stream while Kafka is down: %+v", rep)
	}
	// With the slot free again, a new request streams directly.
	again := postStream(t, t.Context(), url, prompt("direct again"), nil)
	defer again.Body.Close()
	if again.Header.Get("X-Stream-Path") != protocol.PathDirect {
		t.Fatalf("after the slot freed: path %q status %d", again.Header.Get("X-Stream-Path"), again.StatusCode)
	}
	if rep := (loadtest.StreamCheck{Want: c.want("direct again")}).Check(again.Body); rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("second direct stream: %+v", rep)
	}
	health, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != http.StatusOK {
		t.Fatalf("healthz %d", health.StatusCode)
	}
}

// A body near MAX_BODY_BYTES goes through Kafka whole, although it is
// larger than Kafka's 1 MiB default message size: the producer and the
// topics are sized from MAX_BODY_BYTES (a job carries its body whole, and
// config keeps MAX_BODY_BYTES under the job format's limit, so any body
// the api accepts fits the queue).
func TestKafkaLargeBodyQueued(t *testing.T) {
	t.Parallel()
	c, _ := kafkaCluster(t, fastSim(), map[string]string{"MAX_BODY_BYTES": strconv.Itoa(8 << 20), "QUEUE_MAX_BYTES": strconv.Itoa(64 << 20)})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	c.consumer(nil)

	text := strings.Repeat("a long prompt ", (3<<20)/14) // about 3 MiB
	resp := postStream(t, t.Context(), url, prompt(text), nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Stream-Path") != protocol.PathQueued {
		t.Fatalf("3 MiB body: status %d path %q, want 200 queued", resp.StatusCode, resp.Header.Get("X-Stream-Path"))
	}
	if rep := (loadtest.StreamCheck{Want: c.want(text)}).Check(resp.Body); rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("3 MiB body over Kafka: %+v", rep)
	}
}

// The Kafka queue is sized from MAX_BODY_BYTES as docs/QUEUE.md, "Kafka"
// says: the job limit, and the topics' max.message.bytes quoted there.
func TestKafkaSizedFromMaxBody(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxBody         int64
		jobBytes, topic int
	}{
		{1 << 20, 1<<20 + 64<<10, 1_131_520},
		{1024, 1024 + 64<<10, 1024 + 64<<10 + 17<<10},
		{16 << 20, 16<<20 + 64<<10, 16<<20 + 64<<10 + 17<<10},
	} {
		cfg := testConfig(t, map[string]string{"MAX_BODY_BYTES": strconv.FormatInt(tc.maxBody, 10),
			"QUEUE_MAX_BYTES": strconv.FormatInt(max(tc.maxBody, 1<<20), 10)})
		kc := KafkaConfig(cfg, nil)
		if kc.MaxMessageBytes != tc.jobBytes || kc.TopicMaxMessageBytes() != tc.topic {
			t.Errorf("MAX_BODY_BYTES %d: job limit %d, topic max.message.bytes %d; want %d, %d",
				tc.maxBody, kc.MaxMessageBytes, kc.TopicMaxMessageBytes(), tc.jobBytes, tc.topic)
		}
	}
}
