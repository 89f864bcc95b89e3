package kafka

import (
	"bytes"
	"errors"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/kafkatest"
)

// topicMessageBytes reads a topic's max.message.bytes from the broker.
func topicMessageBytes(tb testing.TB, q *Queue, topic string) int {
	tb.Helper()
	have, err := q.messageBytes(ctxT(tb, 5*time.Second), []string{topic})
	if err != nil {
		tb.Fatal(err)
	}
	return have[topic]
}

// TestJobOfMaxMessageBytesFits: with MaxMessageBytes above Kafka's 1 MiB
// default, a job of exactly that size is produced, delivered whole, and
// dead-lettered whole: the producer's batches and both topics were sized
// for it. One byte more is refused as too large (not "unavailable"),
// without reaching the broker.
func TestJobOfMaxMessageBytesFits(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	cfg := testConfig(t, cluster.Brokers, 1, newMemClaims())
	cfg.MaxMessageBytes = 2 << 20
	q := newQueue(t, cfg)
	for _, topic := range []string{cfg.Topic, cfg.Topic + DeadLetterSuffix} {
		if got, want := topicMessageBytes(t, q, topic), cfg.TopicMaxMessageBytes(); got != want {
			t.Fatalf("topic %s created with max.message.bytes %d, want %d", topic, got, want)
		}
	}
	if q.MaxJobBytes() != 2<<20 {
		t.Fatalf("MaxJobBytes = %d, want %d", q.MaxJobBytes(), 2<<20)
	}
	body := bytes.Repeat([]byte("j"), 2<<20)
	if err := q.Enqueue(ctxT(t, 10*time.Second), "req-big", body); err != nil {
		t.Fatalf("Enqueue of a job of MaxMessageBytes: %v", err)
	}
	err := q.Enqueue(ctxT(t, 5*time.Second), "req-bigger", append(body, 'x'))
	if !errors.Is(err, failover.ErrJobTooLarge) || errors.Is(err, failover.ErrQueueUnavailable) {
		t.Fatalf("Enqueue of one byte more = %v, want ErrJobTooLarge only", err)
	}
	c := newConsumer(t, q, "a")
	d := fetchAll(t, c, 1)[0]
	if !bytes.Equal(d.Body, body) {
		t.Fatalf("delivered %d bytes, want the %d enqueued", len(d.Body), len(body))
	}
	if err := c.DeadLetter(ctxT(t, 10*time.Second), d, "too big to answer"); err != nil {
		t.Fatalf("DeadLetter of the largest job: %v", err)
	}
	dls, err := q.DeadLetters(ctxT(t, 10*time.Second), 1)
	if err != nil || len(dls) != 1 || !bytes.Equal(dls[0].Body, body) {
		t.Fatalf("dead letters: %d records, %v; want the whole job", len(dls), err)
	}
	wantDepth(t, q, 0)
}

// createSmallTopics creates cfg's topics with max.message.bytes 100000,
// as a topic made by hand or by an earlier version would be.
func createSmallTopics(tb testing.TB, cfg Config) {
	tb.Helper()
	client := &kafkago.Client{Addr: kafkago.TCP(cfg.Brokers...), Timeout: 5 * time.Second}
	req := &kafkago.CreateTopicsRequest{}
	for _, topic := range []string{cfg.Topic, cfg.Topic + DeadLetterSuffix} {
		req.Topics = append(req.Topics, kafkago.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
			ConfigEntries: []kafkago.ConfigEntry{{ConfigName: topicMaxMessageBytes, ConfigValue: "100000"}}})
	}
	res, err := client.CreateTopics(ctxT(tb, 5*time.Second), req)
	if err != nil {
		tb.Fatal(err)
	}
	for topic, err := range res.Errors {
		if err != nil {
			tb.Fatalf("create %s: %v", topic, err)
		}
	}
}

// TestEnsureTopicsRaisesMessageBytes: topics that exist with a smaller
// max.message.bytes are raised at start, and a 1 MiB job then fits.
func TestEnsureTopicsRaisesMessageBytes(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	cfg := testConfig(t, cluster.Brokers, 1, nil)
	createSmallTopics(t, cfg)
	q := newQueue(t, cfg) // EnsureTopics
	for _, topic := range []string{cfg.Topic, cfg.Topic + DeadLetterSuffix} {
		if got, want := topicMessageBytes(t, q, topic), cfg.TopicMaxMessageBytes(); got != want {
			t.Fatalf("topic %s has max.message.bytes %d after EnsureTopics, want %d", topic, got, want)
		}
	}
	if err := q.Enqueue(ctxT(t, 10*time.Second), "req-1mib", bytes.Repeat([]byte("m"), DefaultMaxMessageBytes)); err != nil {
		t.Fatalf("Enqueue of a 1 MiB job into the raised topic: %v", err)
	}
}

// TestEnsureTopicsCannotRaise: when the broker refuses to raise a small
// topic's max.message.bytes (no permission), EnsureTopics says so and the
// queue takes only jobs the topic carries: a larger one is refused as too
// large at once, the 413 of the api, instead of the broker failing it as
// "unavailable, retry" forever.
func TestEnsureTopicsCannotRaise(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t)
	cluster.Kfake().ControlKey(kmsg.IncrementalAlterConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.Kfake().KeepControl()
		r := req.(*kmsg.IncrementalAlterConfigsRequest)
		resp := r.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
		for _, res := range r.Resources {
			rr := kmsg.NewIncrementalAlterConfigsResponseResource()
			rr.ResourceType, rr.ResourceName = res.ResourceType, res.ResourceName
			rr.ErrorCode = 29 // TOPIC_AUTHORIZATION_FAILED
			resp.Resources = append(resp.Resources, rr)
		}
		return resp, nil, true
	})
	cfg := testConfig(t, cluster.Brokers, 1, nil)
	createSmallTopics(t, cfg)
	q, err := New(cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	err = q.EnsureTopics(ctxT(t, 10*time.Second))
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte(topicMaxMessageBytes+"=100000")) {
		t.Fatalf("EnsureTopics = %v, want an error naming the topic's max.message.bytes=100000", err)
	}
	limit := q.MaxJobBytes()
	if want := 100000 - recordOverhead - batchOverhead; limit != want {
		t.Fatalf("MaxJobBytes = %d after a failed raise, want %d (what the topic carries)", limit, want)
	}
	err = q.Enqueue(ctxT(t, 5*time.Second), "req-over", bytes.Repeat([]byte("o"), limit+1))
	if !errors.Is(err, failover.ErrJobTooLarge) {
		t.Fatalf("Enqueue over the lowered limit = %v, want ErrJobTooLarge", err)
	}
	if err := q.Enqueue(ctxT(t, 5*time.Second), "req-at", bytes.Repeat([]byte("a"), limit)); err != nil {
		t.Fatalf("Enqueue at the lowered limit: %v", err)
	}
	if got := topicMessageBytes(t, q, cfg.Topic); got != 100000 {
		t.Fatalf("topic max.message.bytes %d, want it left at 100000 (the alter was refused)", got)
	}
}
