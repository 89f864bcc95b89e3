package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/admin"
	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/kafkatest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// kafkaQueue opens the rig's Kafka queue with keep as
// DEAD_LETTER_KEEP_PAYLOAD.
func (r *rig) kafkaQueue(keep bool) *kafka.Queue {
	r.t.Helper()
	cfg := r.config(nil)
	claims, err := kafka.NewRedisClaims(kafka.RedisClaimsConfig{Prefix: cfg.QueuePrefix}, r.rdb)
	if err != nil {
		r.t.Fatal(err)
	}
	kc := app.KafkaConfig(cfg, claims)
	kc.KeepPayload = keep
	q, err := kafka.New(kc, testutil.DiscardLogger())
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = q.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := q.EnsureTopics(ctx); err != nil {
		r.t.Fatal(err)
	}
	return q
}

// kafkaDeadLetter dead-letters one job per prompt through a group member,
// as a worker would.
func (r *rig) kafkaDeadLetter(keep bool, prompts ...string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := r.kafkaQueue(keep)
	for i, p := range prompts {
		now := time.Now()
		id := "orig-" + strings.ReplaceAll(p, " ", "-")
		body, err := protocol.EncodeJob(protocol.Job{RequestID: id, UserID: "alice",
			Payload: protocol.ChatRequest{Messages: msgs(p)}, EnqueueTime: now, Deadline: now.Add(time.Second)})
		if err != nil {
			r.t.Fatal(err)
		}
		if err := q.Enqueue(ctx, id, body); err != nil {
			r.t.Fatalf("Enqueue %d: %v", i, err)
		}
	}
	c, err := q.Consumer("seed")
	if err != nil {
		r.t.Fatal(err)
	}
	for n := 0; n < len(prompts); {
		ds, err := c.Fetch(ctx, len(prompts)-n)
		if err != nil {
			r.t.Fatalf("Fetch: %v", err)
		}
		for _, d := range ds {
			if err := c.DeadLetter(ctx, d, "provider-error: upstream kept failing"); err != nil {
				r.t.Fatal(err)
			}
			n++
		}
	}
	_ = c.Close()
}

// TestKafkaDeadLetters: on QUEUE_TYPE=kafka the tool lists, shows and
// replays the dead-letter topic's records (which stay: Kafka cannot
// delete one record), purges the whole topic, and the topic's retention
// follows DEAD_LETTER_TTL_HOURS.
func TestKafkaDeadLetters(t *testing.T) {
	t.Parallel()
	k := kafkatest.Start(t)
	r := newRig(t, fastSim(), map[string]string{
		"QUEUE_TYPE": "kafka", "KAFKA_BROKERS": strings.Join(k.Brokers, ","), "KAFKA_PARTITIONS": "2",
		"WORKER_HEARTBEAT_SECONDS": "2", "DEAD_LETTER_TTL_HOURS": "5",
	})
	r.kafkaDeadLetter(true, "kafka prompt one", "kafka prompt two")
	r.kafkaDeadLetter(false, "kafka secret")
	q := r.kafkaQueue(true)
	depth := func() int64 {
		t.Helper()
		n, err := q.DeadLetterDepth(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	list := r.run("", "list", "-json")
	wantCode(t, list, admin.ExitOK)
	if lines := strings.Split(strings.TrimSpace(list.stdout), "\n"); len(lines) != 3 || !strings.Contains(list.stderr, "3 dead letters (kafka)") {
		t.Fatalf("list:\n%s\n%s", list.stdout, list.stderr)
	}
	if got, err := q.DeadLetterRetention(context.Background()); err != nil || got != 5*time.Hour {
		t.Fatalf("dead-letter topic retention %s, %v; want DEAD_LETTER_TTL_HOURS=5", got, err)
	}
	dls, err := q.DeadLetters(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dls {
		show := r.run("", "show", d.ID)
		wantCode(t, show, admin.ExitOK)
		secret := d.RequestID == "orig-kafka-secret"
		if secret != strings.Contains(show.stdout, "prompt:      not kept") || strings.Contains(show.stdout, "--- user\nkafka secret") {
			t.Fatalf("show %s (%s):\n%s", d.ID, d.RequestID, show.stdout)
		}
	}

	r.consumer()
	res := r.run("", "replay", "-yes", "-all")
	wantCode(t, res, admin.ExitNotReplayable)
	for _, p := range []string{"kafka prompt one", "kafka prompt two"} {
		if !strings.Contains(res.stdout, r.answer(p)) {
			t.Fatalf("replay output lacks the answer to %q:\n%s\n%s", p, res.stdout, res.stderr)
		}
	}
	if !strings.Contains(res.stderr, "replayed: 2 done") || !strings.Contains(res.stderr, "cannot delete single records") {
		t.Fatalf("replay summary:\n%s", res.stderr)
	}
	if n := depth(); n != 3 {
		t.Fatalf("%d dead letters after a replay on Kafka, want the 3 records still there", n)
	}

	wantCode(t, r.run("", "purge", "-yes", dls[0].ID), admin.ExitUsage)
	res = r.run("", "purge", "-yes", "-all")
	wantCode(t, res, admin.ExitOK)
	// This test's own client caches the topic's metadata for a few
	// seconds; the purge itself waited for the new topic.
	testutil.Eventually(t, 20*time.Second, func() bool {
		n, err := q.DeadLetterDepth(context.Background())
		return err == nil && n == 0
	}, "an empty dead-letter topic after purge -all")
	if !strings.Contains(res.stderr, "purged 3 dead letters") {
		t.Fatalf("purge -all: %s", res.stderr)
	}
}
