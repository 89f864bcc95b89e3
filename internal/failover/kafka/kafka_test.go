package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/failovertest"
	"github.com/spillway-dev/spillway/internal/testkit/kafkatest"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// testClaimTTL is the takeover time in tests: long against a heartbeat
// and a rebalance on loopback, short enough for a fast suite.
const testClaimTTL = time.Second

func testLogger() *slog.Logger {
	if os.Getenv("KAFKA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return testutil.DiscardLogger()
}

// testConfig returns a Config with fresh topic and group names and timings
// for fast rebalances.
func testConfig(tb testing.TB, brokers []string, partitions int, claims Claims) Config {
	tb.Helper()
	name := kafkatest.Name(tb)
	return Config{
		Brokers:           brokers,
		Topic:             name,
		Group:             name + ".group",
		Partitions:        partitions,
		SessionTimeout:    2 * time.Second,
		RebalanceTimeout:  2 * time.Second,
		HeartbeatInterval: 100 * time.Millisecond,
		ClaimTTL:          testClaimTTL,
		Claims:            claims,
		// The shared suite compares dead-lettered bodies; redaction is
		// tested in deadletter_test.go.
		KeepPayload: true,
	}
}

func newQueue(tb testing.TB, cfg Config) *Queue {
	tb.Helper()
	q, err := New(cfg, testLogger())
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() { _ = q.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.EnsureTopics(ctx); err != nil {
		tb.Fatalf("EnsureTopics: %v", err)
	}
	return q
}

func newConsumer(tb testing.TB, q *Queue, name string) *Consumer {
	tb.Helper()
	c, err := q.Consumer(name)
	if err != nil {
		tb.Fatalf("Consumer(%q): %v", name, err)
	}
	return c
}

func harness(t *testing.T, q *Queue) failovertest.Harness {
	return failovertest.Harness{
		Producer:    q,
		Depth:       q,
		NewConsumer: func(name string) failover.Consumer { return newConsumer(t, q, name) },
		ReclaimIdle: q.Config().ClaimTTL,
		DeadLetters: func(ctx context.Context) ([]failover.DeadLetter, error) { return q.DeadLetters(ctx, 1<<20) },
		Kill:        func(c failover.Consumer) { _ = c.(*Consumer).Close() },
	}
}

// TestSuite runs the shared behaviour suite on one partition: Kafka orders
// jobs only within a partition, and the suite checks FIFO for one
// consumer. Several partitions are covered by the tests below.
func TestSuite(t *testing.T) {
	cluster := kafkatest.Start(t)
	failovertest.Run(t, func(t *testing.T) failovertest.Harness {
		return harness(t, newQueue(t, testConfig(t, cluster.Brokers, 1, newMemClaims())))
	})
}

// TestSuiteRedisClaims runs the suite with the production claims on a real
// redis-server.
func TestSuiteRedisClaims(t *testing.T) {
	cluster := kafkatest.Start(t)
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	failovertest.Run(t, func(t *testing.T) failovertest.Harness {
		claims, err := NewRedisClaims(RedisClaimsConfig{Prefix: redistest.Prefix(t)}, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return harness(t, newQueue(t, testConfig(t, cluster.Brokers, 1, claims)))
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	b := []string{"127.0.0.1:9092"}
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Brokers: b}, true},
		{"all set", Config{Brokers: b, Topic: "t", Group: "g", DeadLetterTopic: "t.dlq", Partitions: 12,
			ReplicationFactor: 3, RequiredAcks: 1, BatchTimeout: time.Millisecond, WriteTimeout: time.Second,
			SessionTimeout: 10 * time.Second, RebalanceTimeout: 10 * time.Second, HeartbeatInterval: 3 * time.Second,
			ClaimTTL: time.Minute, Claims: newMemClaims(), Timeout: time.Second}, true},
		{"no brokers", Config{}, false},
		{"empty broker", Config{Brokers: []string{""}}, false},
		{"bad topic", Config{Brokers: b, Topic: "a/b"}, false},
		{"long group", Config{Brokers: b, Group: strings.Repeat("g", 250)}, false},
		{"dlq is topic", Config{Brokers: b, Topic: "x", DeadLetterTopic: "x"}, false},
		{"negative partitions", Config{Brokers: b, Partitions: -1}, false},
		{"negative replication", Config{Brokers: b, ReplicationFactor: -1}, false},
		{"acks none", Config{Brokers: b, RequiredAcks: 2}, false},
		{"negative write timeout", Config{Brokers: b, WriteTimeout: -time.Second}, false},
		{"negative claim ttl", Config{Brokers: b, ClaimTTL: -time.Second}, false},
		{"heartbeat not below session", Config{Brokers: b, HeartbeatInterval: 6 * time.Second}, false},
		{"message bytes below 1 KiB", Config{Brokers: b, MaxMessageBytes: 1000}, false},
		{"message bytes above 64 MiB", Config{Brokers: b, MaxMessageBytes: 64<<20 + 1}, false},
		{"message bytes 8 MiB", Config{Brokers: b, MaxMessageBytes: 8 << 20}, true},
	} {
		before := tc.cfg
		before.Brokers = slices.Clone(tc.cfg.Brokers)
		err := tc.cfg.withDefaults().Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if !reflect.DeepEqual(tc.cfg, before) {
			t.Errorf("%s: Validate changed the config", tc.name)
		}
	}
	d := Config{Brokers: b}.withDefaults()
	if d.Topic != "streaming_requests_failover" || d.Group != "streaming_failover_consumers" ||
		d.DeadLetterTopic != "streaming_requests_failover.dead_letter" {
		t.Errorf("default names %q %q %q differ from docs/QUEUE.md", d.Topic, d.Group, d.DeadLetterTopic)
	}
	if d.Partitions != 4 || d.ReplicationFactor != 1 || d.RequiredAcks != -1 || d.BatchTimeout != 5*time.Millisecond ||
		d.WriteTimeout != 5*time.Second || d.ClaimTTL != 15*time.Second || d.MaxMessageBytes != 1<<20 {
		t.Errorf("defaults = %+v", d)
	}
	if got := (Config{Brokers: b, Topic: "jobs"}).withDefaults().DeadLetterTopic; got != "jobs.dead_letter" {
		t.Errorf("DeadLetterTopic for Topic jobs = %q, want jobs.dead_letter", got)
	}
}

// TestNewDoesNoIO: a Queue and a Consumer can be built while Kafka is not
// reachable, so processes start while Kafka is still coming up.
func TestNewDoesNoIO(t *testing.T) {
	t.Parallel()
	q, err := New(Config{Brokers: []string{"127.0.0.1:1"}}, testLogger())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer q.Close()
	c, err := q.Consumer("w1")
	if err != nil {
		t.Fatalf("Consumer: %v", err)
	}
	if _, err := q.Consumer(""); err == nil {
		t.Error("Consumer accepted an empty name")
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close of a consumer that never fetched: %v", err)
	}
	if _, err := New(Config{Brokers: []string{"127.0.0.1:1"}}, nil); err == nil {
		t.Error("New accepted a nil logger")
	}
	if _, err := New(Config{}, testLogger()); err == nil {
		t.Error("New accepted a Config without Brokers")
	}
}

func ctxT(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

func enqueueN(tb testing.TB, q *Queue, n int) {
	tb.Helper()
	for i := range n {
		if err := q.Enqueue(ctxT(tb, 5*time.Second), fmt.Sprintf("req-%d", i), fmt.Appendf(nil, "job-%03d", i)); err != nil {
			tb.Fatalf("Enqueue %d: %v", i, err)
		}
	}
}

// fetchAll fetches until it holds n deliveries.
func fetchAll(tb testing.TB, c *Consumer, n int) []failover.Delivery {
	tb.Helper()
	ctx := ctxT(tb, 45*time.Second) // a group join after a purge waits out rebalances on a loaded machine
	var got []failover.Delivery
	for len(got) < n {
		ds, err := c.Fetch(ctx, n-len(got))
		if err != nil {
			tb.Fatalf("Fetch after %d of %d: %v", len(got), n, err)
		}
		got = append(got, ds...)
	}
	return got
}

func wantDepth(tb testing.TB, q *Queue, want int64) {
	tb.Helper()
	got, err := q.Depth(ctxT(tb, 5*time.Second))
	if err != nil {
		tb.Fatalf("Depth: %v", err)
	}
	if got != want {
		tb.Fatalf("Depth = %d, want %d", got, want)
	}
}

// assigned returns the partitions c owns in its current generation.
func assigned(c *Consumer) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []int
	for id, p := range c.parts {
		if p.gen != nil && p.gen == c.gen {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// fetchInBackground keeps c fetching (so it joins and stays in the group)
// and hands every delivery to out until the test ends.
func fetchInBackground(t *testing.T, c *Consumer, out chan<- failover.Delivery) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			ds, err := c.Fetch(ctx, 10)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, ErrClosed) {
					t.Errorf("Fetch: %v", err)
				}
				return
			}
			for _, d := range ds {
				select {
				case out <- d:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
}

// committedOffsets reads the group's committed offsets from the broker.
func committedOffsets(tb testing.TB, q *Queue) map[int]int64 {
	tb.Helper()
	parts, err := q.partitions(ctxT(tb, 5*time.Second), q.cfg.Topic)
	if err != nil {
		tb.Fatal(err)
	}
	res, err := q.client.OffsetFetch(ctxT(tb, 5*time.Second), &kafkago.OffsetFetchRequest{
		GroupID: q.cfg.Group, Topics: map[string][]int{q.cfg.Topic: parts},
	})
	if err != nil {
		tb.Fatalf("OffsetFetch: %v", err)
	}
	out := make(map[int]int64)
	for _, p := range res.Topics[q.cfg.Topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// TestTwoMembersManyPartitionsExactlyOnce: with 4 partitions split over
// two members and nobody dying, every job is delivered and acknowledged
// exactly once, and both members work.
func TestTwoMembersManyPartitionsExactlyOnce(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, newMemClaims()))
	a, b := newConsumer(t, q, "a"), newConsumer(t, q, "b")
	const jobs = 200
	got := make(chan failover.Delivery, 2*jobs)
	stop := make(chan struct{})
	var ackers sync.WaitGroup
	t.Cleanup(func() { close(stop); ackers.Wait() })
	for _, c := range []*Consumer{a, b} {
		ch := make(chan failover.Delivery)
		fetchInBackground(t, c, ch)
		ackers.Go(func() {
			for {
				select {
				case <-stop:
					return
				case d := <-ch:
					if err := c.Ack(ctxT(t, 5*time.Second), d); err != nil {
						t.Errorf("Ack: %v", err)
					}
					got <- d
				}
			}
		})
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return len(assigned(a)) == 2 && len(assigned(b)) == 2 },
		"both members own two partitions")

	enqueueN(t, q, jobs)
	seen := map[string]int{}
	perMember := map[string]int{}
	timeout := time.After(30 * time.Second)
	for range jobs {
		select {
		case d := <-got:
			if d.Attempt != 1 {
				t.Errorf("job %s delivered with attempt %d although no member died", d.Body, d.Attempt)
			}
			seen[string(d.Body)]++
			pid, _, _ := parseDeliveryID(d.ID)
			if slices.Contains(assigned(a), pid) {
				perMember["a"]++
			} else {
				perMember["b"]++
			}
		case <-timeout:
			t.Fatalf("only %d distinct of %d jobs arrived", len(seen), jobs)
		}
	}
	for i := range jobs {
		if n := seen[fmt.Sprintf("job-%03d", i)]; n != 1 {
			t.Errorf("job-%03d delivered %d times, want once", i, n)
		}
	}
	if perMember["a"] == 0 || perMember["b"] == 0 {
		t.Errorf("deliveries per member = %v, want both members working", perMember)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, err := q.Depth(ctxT(t, 5*time.Second))
		return err == nil && n == 0
	}, "depth 0 after every job was acknowledged")
	// No job comes twice, not even late.
	select {
	case d := <-got:
		t.Fatalf("extra delivery %s attempt %d", d.Body, d.Attempt)
	case <-time.After(2 * testClaimTTL):
	}
}

// TestFetchSpansPartitions: one Fetch hands out up to max jobs from
// several partitions.
func TestFetchSpansPartitions(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, newMemClaims()))
	c := newConsumer(t, q, "a")
	const n = 40
	enqueueN(t, q, n)
	first := fetchAll(t, c, 1)
	testutil.Eventually(t, 10*time.Second, func() bool { return len(c.ready) == n-1 }, "all jobs fetched from Kafka")
	rest, err := c.Fetch(ctxT(t, 5*time.Second), n)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != n-1 {
		t.Fatalf("Fetch(max=%d) with %d ready returned %d", n, n-1, len(rest))
	}
	parts := map[int]bool{}
	for _, d := range append(first, rest...) {
		pid, _, _ := parseDeliveryID(d.ID)
		parts[pid] = true
		if err := c.Ack(ctxT(t, 5*time.Second), d); err != nil {
			t.Fatal(err)
		}
	}
	if len(parts) < 2 {
		t.Fatalf("jobs came from partitions %v, want several", parts)
	}
	wantDepth(t, q, 0)
}

// TestCommitStopsAtLowestUnfinished: an offset acknowledged out of order
// is not committed past an unfinished lower one.
func TestCommitStopsAtLowestUnfinished(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 1, newMemClaims()))
	c := newConsumer(t, q, "a")
	enqueueN(t, q, 3)
	ds := fetchAll(t, c, 3)
	byOffset := map[int64]failover.Delivery{}
	for _, d := range ds {
		_, off, err := parseDeliveryID(d.ID)
		if err != nil {
			t.Fatal(err)
		}
		byOffset[off] = d
	}
	ack := func(off int64) {
		t.Helper()
		if err := c.Ack(ctxT(t, 5*time.Second), byOffset[off]); err != nil {
			t.Fatalf("Ack offset %d: %v", off, err)
		}
	}
	ack(2)
	if got := committedOffsets(t, q)[0]; got > 0 {
		t.Fatalf("after acking offset 2 only, committed offset = %d, want none (or 0)", got)
	}
	wantDepth(t, q, 3)
	ack(0)
	if got := committedOffsets(t, q)[0]; got != 1 {
		t.Fatalf("after acking offsets 2 and 0, committed offset = %d, want 1", got)
	}
	wantDepth(t, q, 2)
	ack(1)
	if got := committedOffsets(t, q)[0]; got != 3 {
		t.Fatalf("after acking all, committed offset = %d, want 3", got)
	}
	wantDepth(t, q, 0)
}

// TestCrashedMemberJobsTakenOver: a member that stops without settling
// (its reader closed) has its jobs delivered to the other member with
// Attempt 2, once the group rebalanced and the claims expired.
func TestCrashedMemberJobsTakenOver(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	claims := newMemClaims()
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, claims))
	a, b := newConsumer(t, q, "a"), newConsumer(t, q, "b")
	fromA, fromB := make(chan failover.Delivery, 100), make(chan failover.Delivery, 100)
	fetchInBackground(t, a, fromA)
	fetchInBackground(t, b, fromB)
	testutil.Eventually(t, 20*time.Second, func() bool { return len(assigned(a)) == 2 && len(assigned(b)) == 2 },
		"both members own two partitions")

	const jobs = 20
	enqueueN(t, q, jobs)
	held := map[string]failover.Delivery{} // a's jobs, never settled
	acked := map[string]bool{}
	deadline := time.After(20 * time.Second)
	for len(held)+len(acked) < jobs {
		select {
		case d := <-fromA:
			held[string(d.Body)] = d
		case d := <-fromB:
			if err := b.Ack(ctxT(t, 5*time.Second), d); err != nil {
				t.Fatal(err)
			}
			acked[string(d.Body)] = true
		case <-deadline:
			t.Fatalf("got %d held + %d acked of %d jobs", len(held), len(acked), jobs)
		}
	}
	if len(held) == 0 || len(acked) == 0 {
		t.Fatalf("a holds %d jobs and b acked %d: want both non-zero (keys hash to both halves)", len(held), len(acked))
	}
	wantDepth(t, q, int64(len(held)))

	var oneOfAs failover.Delivery
	for _, d := range held {
		oneOfAs = d
		break
	}
	crashedAt := time.Now()
	if err := a.Close(); err != nil {
		t.Fatalf("Close a: %v", err)
	}
	deadline = time.After(15 * time.Second)
	for len(held) > 0 {
		select {
		case d := <-fromB:
			orig, ok := held[string(d.Body)]
			switch {
			case !ok:
				t.Fatalf("b got %s again, which it had acknowledged", d.Body)
			case d.Attempt != 2:
				t.Fatalf("takeover of %s has attempt %d, want 2", d.Body, d.Attempt)
			case d.ID != orig.ID:
				t.Fatalf("takeover of %s has id %s, a had %s", d.Body, d.ID, orig.ID)
			}
			if err := b.Ack(ctxT(t, 5*time.Second), d); err != nil {
				t.Fatal(err)
			}
			delete(held, string(d.Body))
		case <-deadline:
			t.Fatalf("%d of a's jobs not taken over within 15s", len(held))
		}
	}
	if waited := time.Since(crashedAt); waited < testClaimTTL/2 {
		t.Errorf("jobs taken over %s after the crash, before their claims could expire (%s)", waited, testClaimTTL)
	}
	// The dead member's claims are lost for good.
	if err := a.Touch(ctxT(t, 5*time.Second), oneOfAs); !errors.Is(err, failover.ErrClaimLost) {
		t.Errorf("Touch by the crashed member = %v, want ErrClaimLost", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, err := q.Depth(ctxT(t, 5*time.Second))
		return err == nil && n == 0
	}, "depth 0 after the takeover")
}

// TestRebalanceKeepsLiveMembersJobs: when a member joins, partitions move
// and their uncommitted jobs are fetched again by the new owner; a job a
// live member still works on is left to it, and a finished one is skipped.
func TestRebalanceKeepsLiveMembersJobs(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	claims := newMemClaims()
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, claims))
	a := newConsumer(t, q, "a")
	const jobs = 12
	enqueueN(t, q, jobs)
	ds := fetchAll(t, a, jobs) // a alone owns all four partitions
	if calls := claims.claimCalls(); calls != jobs {
		t.Fatalf("Claims.Claim called %d times for %d deliveries", calls, jobs)
	}
	// a keeps its jobs alive while b joins and takes two partitions.
	touchCtx, stopTouching := context.WithCancel(context.Background())
	touched := make(chan error, 1)
	go func() {
		tick := time.NewTicker(testClaimTTL / 4)
		defer tick.Stop()
		for {
			select {
			case <-touchCtx.Done():
				touched <- nil
				return
			case <-tick.C:
				for _, d := range ds {
					if err := a.Touch(touchCtx, d); err != nil && touchCtx.Err() == nil {
						touched <- err
						return
					}
				}
			}
		}
	}()
	b := newConsumer(t, q, "b")
	fromB := make(chan failover.Delivery, jobs)
	fetchInBackground(t, b, fromB)
	testutil.Eventually(t, 20*time.Second, func() bool { return len(assigned(b)) == 2 }, "b owns two partitions")
	// b fetched a's uncommitted jobs of its partitions again and asks
	// Claims about them.
	testutil.Eventually(t, 5*time.Second, func() bool { return claims.claimCalls() > jobs }, "b consults Claims")
	select {
	case d := <-fromB:
		t.Fatalf("b got %s (attempt %d) while a works on it", d.Body, d.Attempt)
	case <-time.After(3 * testClaimTTL):
	}
	stopTouching()
	if err := <-touched; err != nil {
		t.Fatalf("Touch by the live owner after the rebalance: %v", err)
	}
	for _, d := range ds {
		if err := a.Ack(ctxT(t, 5*time.Second), d); err != nil {
			t.Fatalf("Ack by a after the rebalance: %v", err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		n, err := q.Depth(ctxT(t, 5*time.Second))
		return err == nil && n == 0
	}, "depth 0 once a acknowledged; b skips the finished jobs and commits")
	select {
	case d := <-fromB:
		t.Fatalf("b got %s (attempt %d) after a finished it", d.Body, d.Attempt)
	case <-time.After(2 * testClaimTTL):
	}
}

func TestDeadLetterTopic(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, newMemClaims()))
	c := newConsumer(t, q, "a")
	if err := q.Enqueue(ctxT(t, 5*time.Second), "req-dl", []byte("poison")); err != nil {
		t.Fatal(err)
	}
	d := fetchAll(t, c, 1)[0]
	before := time.Now()
	if err := c.DeadLetter(ctxT(t, 5*time.Second), d, "provider kept failing"); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	wantDepth(t, q, 0)
	n, err := q.DeadLetterDepth(ctxT(t, 5*time.Second))
	if err != nil || n != 1 {
		t.Fatalf("DeadLetterDepth = %d, %v; want 1", n, err)
	}
	dls, err := q.DeadLetters(ctxT(t, 5*time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	pid, off, _ := parseDeliveryID(d.ID)
	if len(dls) != 1 {
		t.Fatalf("dead letters = %+v, want one", dls)
	}
	got := dls[0]
	if got.RequestID != "req-dl" || string(got.Body) != "poison" || got.Reason != "provider kept failing" ||
		got.Attempt != 1 || got.Source != fmt.Sprintf("job topic partition %d offset %d", pid, off) ||
		got.FailedAt.Before(before.Add(-time.Second)) || got.FailedAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("dead letter = %+v, want req-dl/poison/reason/attempt 1/source %s/failed now", got, d.ID)
	}
	// Settled: nothing comes back, and a second DeadLetter writes nothing.
	if err := c.DeadLetter(ctxT(t, 5*time.Second), d, "again"); err != nil {
		t.Fatalf("second DeadLetter: %v", err)
	}
	if n, _ := q.DeadLetterDepth(ctxT(t, 5*time.Second)); n != 1 {
		t.Fatalf("DeadLetterDepth after a repeated DeadLetter = %d, want 1", n)
	}
}

// TestDepthIsLag: depth is the group's lag over all partitions.
func TestDepthIsLag(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, newMemClaims()))
	wantDepth(t, q, 0)
	enqueueN(t, q, 10)
	wantDepth(t, q, 10) // no member joined yet
	c := newConsumer(t, q, "a")
	ds := fetchAll(t, c, 10)
	wantDepth(t, q, 10)
	// Fetch order is offset order within each partition, so the first
	// three fetched are each the lowest unfinished of their partition.
	for _, d := range ds[:3] {
		if err := c.Ack(ctxT(t, 5*time.Second), d); err != nil {
			t.Fatal(err)
		}
	}
	wantDepth(t, q, 7)
}

// TestEnqueueBrokerDown: with the broker gone or hung, Enqueue fails with
// ErrQueueUnavailable within WriteTimeout instead of hanging.
func TestEnqueueBrokerDown(t *testing.T) {
	t.Parallel()
	const writeTimeout = time.Second
	check := func(t *testing.T, q *Queue) {
		t.Helper()
		start := time.Now()
		err := q.Enqueue(context.Background(), "req-x", []byte("job"))
		took := time.Since(start)
		if !errors.Is(err, failover.ErrQueueUnavailable) {
			t.Errorf("Enqueue = %v, want ErrQueueUnavailable", err)
		}
		if took > writeTimeout+time.Second {
			t.Errorf("Enqueue took %s, want within WriteTimeout %s", took, writeTimeout)
		}
	}
	t.Run("stopped after use", func(t *testing.T) {
		t.Parallel()
		cluster := kafkatest.Start(t)
		cfg := testConfig(t, cluster.Brokers, 4, nil)
		cfg.WriteTimeout = writeTimeout
		q := newQueue(t, cfg)
		enqueueN(t, q, 3)
		if err := q.Ping(ctxT(t, 5*time.Second)); err != nil {
			t.Fatalf("Ping with the broker up: %v", err)
		}
		cluster.Stop()
		check(t, q)
		if err := q.Ping(ctxT(t, 5*time.Second)); err == nil {
			t.Error("Ping with the broker stopped succeeded")
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		q, err := New(Config{Brokers: []string{addr}, WriteTimeout: writeTimeout}, testLogger())
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		check(t, q)
	})
	t.Run("hung", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var conns sync.WaitGroup
		t.Cleanup(func() { l.Close(); conns.Wait() })
		conns.Go(func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				// Read and never answer, until the client gives up.
				conns.Go(func() { _, _ = io.Copy(io.Discard, conn); conn.Close() })
			}
		})
		// Timeout bounds the dial handshake the transport finishes in the
		// background, so the cleanup's wait for the connection is short.
		q, err := New(Config{Brokers: []string{l.Addr().String()}, WriteTimeout: writeTimeout, Timeout: writeTimeout}, testLogger())
		if err != nil {
			t.Fatal(err)
		}
		check(t, q)
		q.Close()
	})
}

// TestFetchEnds: Fetch returns promptly when ctx ends even with Kafka
// unreachable, and with ErrClosed when its Consumer closes.
func TestFetchEnds(t *testing.T) {
	t.Parallel()
	q, err := New(Config{Brokers: []string{"127.0.0.1:1"}}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	c, err := q.Consumer("a")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Fetch(ctxT(t, 100*time.Millisecond), 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch with Kafka down = %v, want DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Fetch took %s to notice its deadline", took)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Fetch(context.Background(), 1)
		errc <- err
	}()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Fetch during Close = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Fetch still blocked 10s after Close")
	}
	select {
	case <-closed:
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return")
	}
	if _, err := c.Fetch(ctxT(t, time.Second), 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Fetch after Close = %v, want ErrClosed", err)
	}
}

// TestWithoutClaims: without Claims the queue still delivers and commits,
// with Attempt 1.
func TestWithoutClaims(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, nil))
	c := newConsumer(t, q, "a")
	enqueueN(t, q, 5)
	for _, d := range fetchAll(t, c, 5) {
		if d.Attempt != 1 {
			t.Errorf("attempt %d without Claims, want 1", d.Attempt)
		}
		if err := c.Touch(ctxT(t, 5*time.Second), d); err != nil {
			t.Errorf("Touch: %v", err)
		}
		if err := c.Ack(ctxT(t, 5*time.Second), d); err != nil {
			t.Errorf("Ack: %v", err)
		}
		if err := c.Touch(ctxT(t, 5*time.Second), d); !errors.Is(err, failover.ErrClaimLost) {
			t.Errorf("Touch after Ack = %v, want ErrClaimLost", err)
		}
	}
	wantDepth(t, q, 0)
}

// TestSettleAfterClose: a job finished after its Consumer closed (a worker
// draining on shutdown) is recorded done, so its new owner skips it.
func TestSettleAfterClose(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	claims := newMemClaims()
	q := newQueue(t, testConfig(t, cluster.Brokers, 1, claims))
	a := newConsumer(t, q, "a")
	enqueueN(t, q, 1)
	d := fetchAll(t, a, 1)[0]
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Ack(ctxT(t, 5*time.Second), d); err != nil {
		t.Fatalf("Ack after Close: %v", err)
	}
	b := newConsumer(t, q, "b")
	if ds, err := b.Fetch(ctxT(t, 3*testClaimTTL), 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("new owner Fetch = %v, %v; want nothing (the job is done)", ds, err)
	}
	wantDepth(t, q, 0) // the new owner skipped it and committed past it
}

func TestDeliveryID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"", "1", "a:1", "1:b", "-1:2", "1:-2", "1:2:3"} {
		if _, _, err := parseDeliveryID(id); err == nil {
			t.Errorf("parseDeliveryID(%q) accepted", id)
		}
	}
	p, o, err := parseDeliveryID(deliveryID(3, 1234))
	if err != nil || p != 3 || o != 1234 {
		t.Errorf("round trip = %d, %d, %v", p, o, err)
	}
}

// TestStalledOwnerCannotSettleSuccessorsJob: a member that stalled past
// its claim (here: it left the group and stopped touching) and comes back
// to acknowledge or dead-letter the job after another member took it over
// is refused with ErrClaimLost and changes nothing: the successor's claim
// stays live, no dead letter is written, and the successor settles the job.
// The owner check and the done mark are one Redis script (release.lua).
func TestStalledOwnerCannotSettleSuccessorsJob(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	srv := redistest.Start(t)
	claims, err := NewRedisClaims(RedisClaimsConfig{Prefix: redistest.Prefix(t)}, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	q := newQueue(t, testConfig(t, cluster.Brokers, 1, claims))
	a := newConsumer(t, q, "a")
	enqueueN(t, q, 1)
	stale := fetchAll(t, a, 1)[0]
	if err := a.Close(); err != nil { // a stalls: out of the group, no more touches
		t.Fatal(err)
	}
	b := newConsumer(t, q, "b")
	taken := fetchAll(t, b, 1)[0] // after ClaimTTL: a takeover
	if taken.Attempt != 2 || taken.ID != stale.ID {
		t.Fatalf("takeover %+v, want attempt 2 of %s", taken, stale.ID)
	}

	if err := a.DeadLetter(ctxT(t, 5*time.Second), stale, "stalled worker gives up"); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("DeadLetter by the stalled owner = %v, want ErrClaimLost", err)
	}
	if err := a.Ack(ctxT(t, 5*time.Second), stale); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("Ack by the stalled owner = %v, want ErrClaimLost", err)
	}
	if err := b.Touch(ctxT(t, 5*time.Second), taken); err != nil {
		t.Fatalf("the successor's Touch after the stalled owner settled = %v, want its claim intact", err)
	}
	if n, err := q.DeadLetterDepth(ctxT(t, 5*time.Second)); err != nil || n != 0 {
		t.Fatalf("dead letters %d, %v; want none from the stalled owner", n, err)
	}
	wantDepth(t, q, 1)
	if err := b.Ack(ctxT(t, 5*time.Second), taken); err != nil {
		t.Fatalf("Ack by the successor: %v", err)
	}
	wantDepth(t, q, 0)
}

// TestStalledOwnerWithoutClaims: without Claims the generation is the
// owner check: a member whose partition moved cannot dead-letter or
// commit the job the partition's new owner was handed again.
func TestStalledOwnerWithoutClaims(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 1, nil))
	a := newConsumer(t, q, "a")
	enqueueN(t, q, 1)
	stale := fetchAll(t, a, 1)[0]
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := newConsumer(t, q, "b")
	again := fetchAll(t, b, 1)[0]
	if again.ID != stale.ID {
		t.Fatalf("b got %s, want %s again", again.ID, stale.ID)
	}
	if err := a.DeadLetter(ctxT(t, 5*time.Second), stale, "stalled"); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("DeadLetter by the former owner = %v, want ErrClaimLost", err)
	}
	if err := a.Ack(ctxT(t, 5*time.Second), stale); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("Ack by the former owner = %v, want ErrClaimLost", err)
	}
	if n, err := q.DeadLetterDepth(ctxT(t, 5*time.Second)); err != nil || n != 0 {
		t.Fatalf("dead letters %d, %v; want none", n, err)
	}
	wantDepth(t, q, 1)
	if err := b.Ack(ctxT(t, 5*time.Second), again); err != nil {
		t.Fatal(err)
	}
	wantDepth(t, q, 0)
}
