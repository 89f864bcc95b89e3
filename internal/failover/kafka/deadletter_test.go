package kafka

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/kafkatest"
)

// deadLetterN enqueues n jobs, fetches them with one member and
// dead-letters each, so the records spread over the partitions.
func deadLetterN(tb testing.TB, q *Queue, n int) {
	tb.Helper()
	enqueueN(tb, q, n)
	c := newConsumer(tb, q, "dl")
	// It leaves the group when done, so a consumer the test starts later
	// joins without a rebalance that waits for an idle member.
	defer func() { _ = c.Close() }()
	for _, d := range fetchAll(tb, c, n) {
		if err := c.DeadLetter(ctxT(tb, 5*time.Second), d, "provider kept failing"); err != nil {
			tb.Fatalf("DeadLetter %s: %v", d.ID, err)
		}
	}
}

// TestDeadLetterRedacted: without KeepPayload a dead letter holds the
// job's digest and size, not the job (the user's prompt).
func TestDeadLetterRedacted(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	cfg := testConfig(t, cluster.Brokers, 1, newMemClaims())
	cfg.KeepPayload = false
	q := newQueue(t, cfg)
	deadLetterN(t, q, 1)
	dls, err := q.DeadLetters(ctxT(t, 5*time.Second), 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadLetters = %+v, %v; want one", dls, err)
	}
	sum := sha1.Sum([]byte("job-000"))
	got := dls[0]
	if len(got.Body) != 0 || got.BodySHA1 != hex.EncodeToString(sum[:]) || got.BodyBytes != len("job-000") || got.RequestID != "req-0" {
		t.Fatalf("dead letter = %+v, want no body, sha1 %x, 7 bytes, req-0", got, sum)
	}
}

// TestDeadLetterKeptPayloadDigest: with KeepPayload the body is kept and
// the digest and size are recorded too.
func TestDeadLetterKeptPayloadDigest(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 1, newMemClaims()))
	deadLetterN(t, q, 1)
	dls, err := q.DeadLetters(ctxT(t, 5*time.Second), 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadLetters = %+v, %v; want one", dls, err)
	}
	sum := sha1.Sum([]byte("job-000"))
	if got := dls[0]; string(got.Body) != "job-000" || got.BodySHA1 != hex.EncodeToString(sum[:]) || got.BodyBytes != 7 {
		t.Fatalf("dead letter = %+v, want body job-000 with its digest and size", got)
	}
}

// TestDeadLetterRetention: EnsureTopics gives the dead-letter topic
// retention.ms = DeadLetterRetention, and corrects a topic created with
// another value, leaving its other settings alone.
func TestDeadLetterRetention(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	cfg := testConfig(t, cluster.Brokers, 1, newMemClaims())
	cfg.DeadLetterRetention = 3 * time.Hour
	q := newQueue(t, cfg)
	if got, err := q.DeadLetterRetention(ctxT(t, 5*time.Second)); err != nil || got != 3*time.Hour {
		t.Fatalf("retention after EnsureTopics = %s, %v; want 3h", got, err)
	}

	// An existing topic with another retention and a setting of its own.
	cfg2 := testConfig(t, cluster.Brokers, 1, newMemClaims())
	cl := &kafkago.Client{Addr: kafkago.TCP(cluster.Brokers...), Timeout: 5 * time.Second}
	res, err := cl.CreateTopics(ctxT(t, 5*time.Second), &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
		Topic: cfg2.Topic + DeadLetterSuffix, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kafkago.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: "1000"}, {ConfigName: "cleanup.policy", ConfigValue: "compact,delete"}},
	}}})
	if err != nil || res.Errors[cfg2.Topic+DeadLetterSuffix] != nil {
		t.Fatalf("CreateTopics: %v %v", err, res)
	}
	q2 := newQueue(t, cfg2)
	if got, err := q2.DeadLetterRetention(ctxT(t, 5*time.Second)); err != nil || got != failover.DefaultDeadLetterTTL {
		t.Fatalf("retention of an existing topic after EnsureTopics = %s, %v; want %s", got, err, failover.DefaultDeadLetterTTL)
	}
	if v, err := q2.topicConfig(ctxT(t, 5*time.Second), cfg2.Topic+DeadLetterSuffix, "cleanup.policy"); err != nil || v != "compact,delete" {
		t.Fatalf("cleanup.policy = %q, %v; an incremental alter must keep it", v, err)
	}
}

// TestDeadLetterPages: pages of any size return every record exactly once,
// in time order, across partitions; a record is found by its id.
func TestDeadLetterPages(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	q := newQueue(t, testConfig(t, cluster.Brokers, 4, newMemClaims()))
	const n = 11
	deadLetterN(t, q, n)
	all, err := q.DeadLetters(ctxT(t, 10*time.Second), 100)
	if err != nil || len(all) != n {
		t.Fatalf("DeadLetters = %d, %v; want %d", len(all), err, n)
	}
	for _, size := range []int{1, 3, n, n + 5} {
		var got []string
		cursor, pages := "", 0
		for {
			page, next, err := q.DeadLetterPage(ctxT(t, 10*time.Second), cursor, size)
			if err != nil {
				t.Fatalf("page size %d after %q: %v", size, cursor, err)
			}
			if len(page) > size {
				t.Fatalf("page size %d returned %d", size, len(page))
			}
			for _, d := range page {
				got = append(got, d.ID)
			}
			pages++
			if next == "" {
				break
			}
			if pages > n+1 {
				t.Fatalf("page size %d: no end after %d pages", size, pages)
			}
			cursor = next
		}
		want := make([]string, len(all))
		for i, d := range all {
			want[i] = d.ID
		}
		if !slices.Equal(got, want) {
			t.Fatalf("page size %d: ids %v, want %v", size, got, want)
		}
	}
	for i := 1; i < len(all); i++ {
		if all[i].FailedAt.Before(all[i-1].FailedAt) {
			t.Fatalf("not oldest first: %v before %v", all[i-1].FailedAt, all[i].FailedAt)
		}
	}
	one, err := q.DeadLetterByID(ctxT(t, 5*time.Second), all[4].ID)
	if err != nil || one.ID != all[4].ID || one.RequestID != all[4].RequestID || string(one.Body) != string(all[4].Body) {
		t.Fatalf("DeadLetterByID(%s) = %+v, %v; want %+v", all[4].ID, one, err, all[4])
	}
	for _, id := range []string{"0:999", "9:0", "x", "-1:0", ""} {
		if _, err := q.DeadLetterByID(ctxT(t, 5*time.Second), id); !errors.Is(err, failover.ErrDeadLetterNotFound) {
			t.Errorf("DeadLetterByID(%q) = %v, want ErrDeadLetterNotFound", id, err)
		}
	}
	if _, _, err := q.DeadLetterPage(ctxT(t, 5*time.Second), "garbage", 5); err == nil {
		t.Error("DeadLetterPage accepted a malformed cursor")
	}
}

// TestPurgeDeadLetters: purge empties the topic, which is there again
// with its partitions and retention, and takes new dead letters.
func TestPurgeDeadLetters(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	cfg := testConfig(t, cluster.Brokers, 2, newMemClaims())
	cfg.DeadLetterRetention = 2 * time.Hour
	q := newQueue(t, cfg)
	deadLetterN(t, q, 3)
	n, err := q.PurgeDeadLetters(ctxT(t, 40*time.Second))
	if err != nil || n != 3 {
		t.Fatalf("PurgeDeadLetters = %d, %v; want 3", n, err)
	}
	if d, err := q.DeadLetterDepth(ctxT(t, 5*time.Second)); err != nil || d != 0 {
		t.Fatalf("DeadLetterDepth after purge = %d, %v; want 0", d, err)
	}
	parts, err := q.partitions(ctxT(t, 5*time.Second), q.cfg.DeadLetterTopic)
	if err != nil || len(parts) != 2 {
		t.Fatalf("partitions after purge = %v, %v; want 2", parts, err)
	}
	if got, err := q.DeadLetterRetention(ctxT(t, 5*time.Second)); err != nil || got != 2*time.Hour {
		t.Fatalf("retention after purge = %s, %v; want 2h", got, err)
	}
	// The workers' writer still works against the new topic.
	if err := q.Enqueue(ctxT(t, 5*time.Second), "req-after", []byte("after")); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, q, "after")
	var dl error
	for _, d := range fetchAll(t, c, 1) {
		dl = c.DeadLetter(ctxT(t, 10*time.Second), d, "again")
	}
	if dl != nil {
		t.Fatalf("DeadLetter after purge: %v", dl)
	}
	dls, err := q.DeadLetters(ctxT(t, 5*time.Second), 10)
	if err != nil || len(dls) != 1 || dls[0].RequestID != "req-after" {
		t.Fatalf("dead letters after purge = %+v, %v; want req-after only", dls, err)
	}
}
