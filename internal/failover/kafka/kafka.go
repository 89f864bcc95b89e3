// Package kafka owns the Kafka failover queue (QUEUE_TYPE=kafka): jobs in
// the topic streaming_requests_failover keyed by request id, read by the
// consumer group streaming_failover_consumers, failed jobs in the topic
// streaming_requests_failover.dead_letter. It gives workers the contract
// of the Redis Streams queue (failover.Producer, Depther and Consumer),
// which Kafka alone does not:
//
//   - Offsets. A partition has one committed offset, but its jobs finish
//     out of order. Each Consumer tracks the offsets it fetched and
//     commits a partition only up to its lowest unfinished job, so an
//     acknowledged offset never hides an unfinished one. Uncommitted jobs
//     are fetched again by whoever owns the partition after a group
//     rebalance (a member joined, left or died).
//   - Attempts and takeover. Kafka counts no deliveries and cannot tell a
//     re-fetched job still running on a live member from one whose worker
//     died. Config.Claims (RedisClaims in production) keeps a claim per job
//     with a TTL that Touch extends: a re-fetched job whose claim is live
//     waits, a finished one is skipped, and one whose claim expired is
//     taken over with its attempt count grown, so the worker sends reset.
//     Without Claims every delivery has Attempt 1 and a rebalance may hand
//     out a running or finished job again.
//
// Only the member owning a job's partition can take the job over, so a
// member that stays in the group but stops touching a job on a partition
// it still owns keeps that job, unlike with Redis Streams; a crashed
// member's partitions move once its session times out (a clean Close
// leaves at once).
//
// A Consumer drives kafka-go's ConsumerGroup and one partition reader per
// assigned partition, not a kafka.Reader with a GroupID: that Reader hides
// which partitions it owns and sends each commit through whatever
// generation is current, so a former owner's late commit could move a
// partition's offset backwards. Here each commit carries the generation
// that owned the partition, and the broker refuses it once that ended.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// Defaults applied to zero Config fields. Names match docs/QUEUE.md, "Kafka".
const (
	DefaultTopic             = "streaming_requests_failover"
	DefaultGroup             = "streaming_failover_consumers"
	DeadLetterSuffix         = ".dead_letter"
	DefaultPartitions        = 4
	DefaultReplicationFactor = 1
	DefaultRequiredAcks      = -1
	DefaultBatchTimeout      = 5 * time.Millisecond
	DefaultWriteTimeout      = 5 * time.Second
	DefaultSessionTimeout    = 6 * time.Second
	DefaultRebalanceTimeout  = 5 * time.Second
	DefaultHeartbeatInterval = time.Second
	DefaultTimeout           = 5 * time.Second
	DefaultMaxMessageBytes   = 1 << 20
)

// Bounds of Config.MaxMessageBytes, and the room a record and its batch
// need beside a job of that size (docs/QUEUE.md, "Kafka").
const (
	minMaxMessageBytes = 1 << 10
	maxMaxMessageBytes = 64 << 20
	// recordOverhead is the room beside a job's bytes in its record: the
	// key (a request id), the trace headers, a dead letter's headers (its
	// reason capped at maxReasonBytes) and the record's own framing.
	recordOverhead = 16 << 10
	// batchOverhead is a record batch's header (61 bytes in format v2)
	// with room to spare: brokers hold whole batches to max.message.bytes.
	batchOverhead = 1 << 10
	// topicMaxMessageBytes names the topic setting EnsureTopics manages.
	topicMaxMessageBytes = "max.message.bytes"
)

// Config configures a Queue. Zero fields take the stated defaults.
type Config struct {
	// Brokers are bootstrap "host:port" addresses (KAFKA_BROKERS).
	// Required.
	Brokers []string
	// Topic holds the jobs. Default "streaming_requests_failover".
	Topic string
	// Group is the consumer group. Default "streaming_failover_consumers".
	Group string
	// DeadLetterTopic receives dead-lettered jobs. Default Topic +
	// ".dead_letter".
	DeadLetterTopic string
	// Partitions is the partition count EnsureTopics creates both topics
	// with (KAFKA_PARTITIONS); it bounds how many consumer processes share
	// the work. Existing topics are left as they are. Default 4.
	Partitions int
	// ReplicationFactor is what EnsureTopics creates both topics with
	// (KAFKA_REPLICATION_FACTOR). Default 1.
	ReplicationFactor int
	// RequiredAcks is -1 (all in-sync replicas, the default) or 1 (the
	// leader only). Enqueue returns once that many acknowledged; 0 (no
	// acknowledgement) is not offered because it is not durable.
	RequiredAcks int
	// BatchTimeout is how long the producer waits to fill a batch; it adds
	// to every Enqueue's latency (kafka-go's own default is 1s). Default 5ms.
	BatchTimeout time.Duration
	// WriteTimeout bounds one Enqueue, whatever its ctx: an unreachable or
	// hung broker yields ErrQueueUnavailable within it. Default 5s.
	WriteTimeout time.Duration
	// SessionTimeout is how long the group coordinator waits for a silent
	// member (a crashed process) before moving its partitions. The broker
	// bounds it (group.min.session.timeout.ms, 6s by default). Default 6s.
	SessionTimeout time.Duration
	// RebalanceTimeout is how long the coordinator waits for members to
	// rejoin during a rebalance. Default 5s.
	RebalanceTimeout time.Duration
	// HeartbeatInterval is how often a member heartbeats, and so how soon
	// it notices a rebalance. Below SessionTimeout. Default 1s.
	HeartbeatInterval time.Duration
	// ClaimTTL is how long a job's claim lives without Touch before another
	// member may take the job over once its partition moved
	// (QUEUE_RECLAIM_IDLE_SECONDS). Used only with Claims. Default failover.DefaultReclaimIdle.
	ClaimTTL time.Duration
	// Claims keeps per-job claims and attempt counts (see the package
	// doc). Optional: nil means Attempt is always 1, Touch only checks the
	// delivery is outstanding, and a rebalance may deliver a job twice.
	// Production wires RedisClaims. The Queue does not close it.
	Claims Claims
	// Timeout bounds each metadata, offset, commit and topic-admin request
	// and each dial. Default 5s.
	Timeout time.Duration
	// MaxMessageBytes is the largest job (a record's value) Enqueue takes;
	// the api derives it from MAX_BODY_BYTES. The producer's batches and
	// both topics' max.message.bytes (TopicMaxMessageBytes) are sized to
	// carry such a job with its key and headers, and EnsureTopics raises
	// the setting of topics that have less. A larger job is refused with
	// failover.ErrJobTooLarge. Default 1 MiB; 1 KiB to 64 MiB.
	MaxMessageBytes int
	// DeadLetterRetention is the dead-letter topic's retention.ms
	// (DEAD_LETTER_TTL_HOURS): EnsureTopics sets it on the topic, so a
	// dead letter is deleted by the brokers once it is that old. Whole
	// milliseconds. Default failover.DefaultDeadLetterTTL.
	DeadLetterRetention time.Duration
	// KeepPayload stores the job's body in a dead letter
	// (DEAD_LETTER_KEEP_PAYLOAD); false writes an empty value and the
	// body's SHA-1 and size in headers, so prompts do not pile up in the
	// topic.
	KeepPayload bool
	// Tracing writes the trace context of Enqueue's ctx into the record's
	// traceparent, tracestate and baggage headers (docs/TRACING.md); nil
	// writes none.
	Tracing *telemetry.Provider
}

// Validate reports whether cfg is usable, Partitions and
// ReplicationFactor out of range as *bounds.Errors. Those two it checks
// as given: New fills them in, with the other zero fields that have a
// default, before it calls Validate. It does not change cfg.
func (cfg Config) Validate() error {
	c := cfg.withDefaults()
	errs := []error{
		bounds.AtLeast("Partitions", cfg.Partitions, 1),
		bounds.AtLeast("ReplicationFactor", cfg.ReplicationFactor, 1),
	}
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("Brokers is required"))
	}
	for _, b := range c.Brokers {
		if b == "" {
			errs = append(errs, errors.New("Brokers has an empty address"))
			break
		}
		if strings.Contains(b, "@") {
			// Not quoted: the part before the @ may be a secret.
			errs = append(errs, errors.New("Brokers has an address with a user part (user@host:port); give host:port only"))
			break
		}
	}
	for _, n := range []struct{ field, name string }{
		{"Topic", c.Topic}, {"Group", c.Group}, {"DeadLetterTopic", c.DeadLetterTopic},
	} {
		if err := validName(n.name); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", n.field, n.name, err))
		}
	}
	if c.DeadLetterTopic == c.Topic {
		errs = append(errs, fmt.Errorf("DeadLetterTopic equals Topic %q", c.Topic))
	}
	if c.RequiredAcks != -1 && c.RequiredAcks != 1 {
		errs = append(errs, fmt.Errorf("RequiredAcks %d is neither -1 (all) nor 1 (leader)", cfg.RequiredAcks))
	}
	for _, d := range []struct {
		field      string
		set, value time.Duration
		least      time.Duration
	}{
		{"BatchTimeout", cfg.BatchTimeout, c.BatchTimeout, time.Microsecond},
		{"WriteTimeout", cfg.WriteTimeout, c.WriteTimeout, time.Millisecond},
		{"SessionTimeout", cfg.SessionTimeout, c.SessionTimeout, time.Millisecond},
		{"RebalanceTimeout", cfg.RebalanceTimeout, c.RebalanceTimeout, time.Millisecond},
		{"HeartbeatInterval", cfg.HeartbeatInterval, c.HeartbeatInterval, time.Millisecond},
		{"ClaimTTL", cfg.ClaimTTL, c.ClaimTTL, time.Millisecond},
		{"Timeout", cfg.Timeout, c.Timeout, time.Millisecond},
		{"DeadLetterRetention", cfg.DeadLetterRetention, c.DeadLetterRetention, time.Millisecond},
	} {
		if d.set < 0 || d.value < d.least {
			errs = append(errs, fmt.Errorf("%s %s is below %s (0 means the default)", d.field, d.set, d.least))
		}
	}
	if c.MaxMessageBytes < minMaxMessageBytes || c.MaxMessageBytes > maxMaxMessageBytes {
		errs = append(errs, fmt.Errorf("MaxMessageBytes %d is outside [%d, %d] (0 means the default)",
			cfg.MaxMessageBytes, minMaxMessageBytes, maxMaxMessageBytes))
	}
	if c.HeartbeatInterval >= c.SessionTimeout {
		errs = append(errs, fmt.Errorf("HeartbeatInterval %s is not below SessionTimeout %s", c.HeartbeatInterval, c.SessionTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kafka: config: %w", err)
	}
	return nil
}

// validName checks a topic or group name against Kafka's rules.
func validName(s string) error {
	if s == "" || s == "." || s == ".." {
		return errors.New("empty, . or ..")
	}
	if len(s) > 249 {
		return errors.New("longer than 249 characters")
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("character %q outside [a-zA-Z0-9._-]", r)
		}
	}
	return nil
}

func (cfg Config) withDefaults() Config {
	cfg.Brokers = slices.Clone(cfg.Brokers)
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.DeadLetterTopic == "" {
		cfg.DeadLetterTopic = cfg.Topic + DeadLetterSuffix
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = DefaultPartitions
	}
	if cfg.ReplicationFactor == 0 {
		cfg.ReplicationFactor = DefaultReplicationFactor
	}
	if cfg.RequiredAcks == 0 {
		cfg.RequiredAcks = DefaultRequiredAcks
	}
	if cfg.BatchTimeout == 0 {
		cfg.BatchTimeout = DefaultBatchTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.RebalanceTimeout == 0 {
		cfg.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.ClaimTTL == 0 {
		cfg.ClaimTTL = failover.DefaultReclaimIdle
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.DeadLetterRetention == 0 {
		cfg.DeadLetterRetention = failover.DefaultDeadLetterTTL
	}
	return cfg
}

// batchBytes is the producer's batch limit: one record of the largest job.
func (cfg Config) batchBytes() int { return cfg.MaxMessageBytes + recordOverhead }

// TopicMaxMessageBytes is the max.message.bytes both topics need so that a
// job of MaxMessageBytes fits, as a job and as a dead letter: what
// EnsureTopics creates them with, or raises them to.
func (cfg Config) TopicMaxMessageBytes() int {
	return cfg.withDefaults().batchBytes() + batchOverhead
}

// ErrClosed is returned by calls on a closed Queue or Consumer.
var ErrClosed = errors.New("kafka: closed")

// Queue is the Kafka failover queue as seen by one process: the producer
// side, depth, dead-letter reads, and a factory for consumer-group members.
// Safe for concurrent use. It owns the producer, the connections and the
// Consumers it creates and closes them all in Close; it never closes
// Config.Claims.
type Queue struct {
	cfg       Config
	log       *slog.Logger
	transport *kafkago.Transport
	client    *kafkago.Client
	writer    *kafkago.Writer

	// jobLimit is the largest job Enqueue takes: MaxMessageBytes, or less
	// once EnsureTopics found a topic that cannot take that much.
	jobLimit atomic.Int64

	mu        sync.Mutex
	closed    bool
	consumers map[*Consumer]struct{}
}

var (
	_ failover.Producer   = (*Queue)(nil)
	_ failover.Depther    = (*Queue)(nil)
	_ failover.JobLimiter = (*Queue)(nil)
)

// New returns a Queue. It does no network I/O: connections are opened on
// first use, and a process can start while Kafka is still coming up. Call
// EnsureTopics before the first Enqueue or Consumer.
func New(cfg Config, log *slog.Logger) (*Queue, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		return nil, errors.New("kafka: nil logger")
	}
	transport := &kafkago.Transport{
		DialTimeout: cfg.Timeout,
		ClientID:    "spillway",
	}
	addr := kafkago.TCP(cfg.Brokers...)
	q := &Queue{
		cfg:       cfg,
		log:       log,
		transport: transport,
		client:    &kafkago.Client{Addr: addr, Timeout: cfg.Timeout, Transport: transport},
		consumers: make(map[*Consumer]struct{}),
	}
	q.writer = &kafkago.Writer{
		Addr: addr,
		// The topic is set per message: jobs and dead letters share the
		// writer. Keying by request id spreads jobs over partitions.
		Balancer:     &kafkago.Hash{},
		RequiredAcks: kafkago.RequiredAcks(cfg.RequiredAcks),
		BatchTimeout: cfg.BatchTimeout,
		// kafka-go's default (1 MiB) is below a job of MAX_BODY_BYTES
		// with its key and headers; the topics take a batch this big.
		BatchBytes:   int64(cfg.batchBytes()),
		ReadTimeout:  cfg.WriteTimeout,
		WriteTimeout: cfg.WriteTimeout,
		// A few quick retries ride out a leader change; the ctx of each
		// call bounds them all.
		MaxAttempts:     3,
		WriteBackoffMin: 10 * time.Millisecond,
		WriteBackoffMax: 200 * time.Millisecond,
		// Topics are created by EnsureTopics with the configured partition
		// count, never by a produce with the broker's defaults.
		AllowAutoTopicCreation: false,
		Transport:              transport,
		ErrorLogger:            kafkaLogger(log, slog.LevelDebug),
	}
	q.jobLimit.Store(int64(cfg.MaxMessageBytes))
	return q, nil
}

// MaxJobBytes implements failover.JobLimiter: the largest job Enqueue
// takes now.
func (q *Queue) MaxJobBytes() int { return int(q.jobLimit.Load()) }

// kafkaLogger adapts kafka-go's printf logging to log at level. kafka-go
// logs routine rebalance churn as errors, so it goes to debug: this package
// logs what matters itself.
func kafkaLogger(log *slog.Logger, level slog.Level) kafkago.Logger {
	return kafkago.LoggerFunc(func(format string, args ...any) {
		if log.Enabled(context.Background(), level) {
			log.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(format, args...))
		}
	})
}

// Config returns the configuration with defaults applied.
func (q *Queue) Config() Config { return q.cfg }

// Close closes every Consumer the Queue created (each leaves the group,
// its unfinished jobs left for takeover), then flushes and closes the
// producer and drops idle connections. Later calls return ErrClosed.
// Shutdown order for a worker: stop calling Fetch, let running jobs
// settle, then Close.
func (q *Queue) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	consumers := make([]*Consumer, 0, len(q.consumers))
	for c := range q.consumers {
		consumers = append(consumers, c)
	}
	q.mu.Unlock()
	var errs []error
	for _, c := range consumers {
		errs = append(errs, c.Close())
	}
	errs = append(errs, q.writer.Close())
	q.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// EnsureTopics creates the job topic and the dead-letter topic with
// Config.Partitions, Config.ReplicationFactor and TopicMaxMessageBytes
// unless they exist. Of topics that exist, a smaller partition count than
// configured is logged; a max.message.bytes below TopicMaxMessageBytes is
// raised to it, and when that fails (no permission to alter topics) the
// error is returned and the Queue lowers MaxJobBytes to what the smaller
// topic carries, so a larger job is refused at once as too large instead
// of failing at the broker; and the dead-letter topic's retention.ms is
// set to Config.DeadLetterRetention when it differs. Safe to call from
// every process at start.
func (q *Queue) EnsureTopics(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	topics := []string{q.cfg.Topic, q.cfg.DeadLetterTopic}
	req := &kafkago.CreateTopicsRequest{}
	for _, t := range topics {
		req.Topics = append(req.Topics, kafkago.TopicConfig{
			Topic:             t,
			NumPartitions:     q.cfg.Partitions,
			ReplicationFactor: q.cfg.ReplicationFactor,
			ConfigEntries: []kafkago.ConfigEntry{{
				ConfigName: topicMaxMessageBytes, ConfigValue: strconv.Itoa(q.cfg.TopicMaxMessageBytes()),
			}},
		})
	}
	res, err := q.client.CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("kafka: create topics %v: %w", topics, err)
	}
	var errs []error
	for _, t := range topics {
		if err := res.Errors[t]; err != nil && !errors.Is(err, kafkago.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("kafka: create topic %s: %w", t, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	parts, err := q.partitions(ctx, q.cfg.Topic)
	if err != nil {
		return err
	}
	if len(parts) < q.cfg.Partitions {
		q.log.Warn("kafka topic has fewer partitions than configured; add partitions to scale out consumers",
			"topic", q.cfg.Topic, "partitions", len(parts), "configured", q.cfg.Partitions)
	}
	return errors.Join(q.ensureMessageBytes(ctx, topics), q.ensureDeadLetterRetention(ctx))
}

// ensureMessageBytes reads each topic's max.message.bytes and raises any
// below TopicMaxMessageBytes. A topic left smaller lowers the job limit to
// what it carries, and is returned as an error naming the setting.
func (q *Queue) ensureMessageBytes(ctx context.Context, topics []string) error {
	need := q.cfg.TopicMaxMessageBytes()
	have, err := q.messageBytes(ctx, topics)
	if err != nil {
		return err
	}
	limit := q.cfg.MaxMessageBytes
	var errs []error
	for _, t := range topics {
		if have[t] >= need {
			continue
		}
		res, err := q.client.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{
			Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
				ResourceType: kafkago.ResourceTypeTopic, ResourceName: t,
				Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{
					Name: topicMaxMessageBytes, Value: strconv.Itoa(need), ConfigOperation: kafkago.ConfigOperationSet,
				}},
			}},
		})
		if err == nil && len(res.Resources) > 0 {
			err = res.Resources[0].Error
		}
		if err == nil {
			q.log.Info("kafka topic's max.message.bytes raised to carry a job of the largest body",
				"topic", t, "from", have[t], "to", need)
			continue
		}
		limit = min(limit, max(0, have[t]-recordOverhead-batchOverhead))
		errs = append(errs, fmt.Errorf("kafka: topic %s has %s=%d, below the %d a job of %d bytes needs, and raising it failed: %w",
			t, topicMaxMessageBytes, have[t], need, q.cfg.MaxMessageBytes, err))
	}
	q.jobLimit.Store(int64(limit))
	if err := errors.Join(errs...); err != nil {
		q.log.Error("kafka topics cannot carry the largest jobs; larger jobs are refused with 413 until "+
			topicMaxMessageBytes+" is raised", "job_limit", limit, "err", err)
		return err
	}
	return nil
}

// refusedAsTooLarge reports whether a write failed because the broker
// found the batch too large. kafka-go reports a batch's failure inside
// WriteErrors, which does not unwrap.
func refusedAsTooLarge(err error) bool {
	if errors.Is(err, kafkago.MessageSizeTooLarge) {
		return true
	}
	var werrs kafkago.WriteErrors
	if errors.As(err, &werrs) {
		for _, e := range werrs {
			if errors.Is(e, kafkago.MessageSizeTooLarge) {
				return true
			}
		}
	}
	return false
}

// messageBytes returns the max.message.bytes each topic has (its own or
// the broker's default).
func (q *Queue) messageBytes(ctx context.Context, topics []string) (map[string]int, error) {
	req := &kafkago.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafkago.DescribeConfigRequestResource{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{topicMaxMessageBytes},
		})
	}
	res, err := q.client.DescribeConfigs(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("kafka: describe configs of %v: %w", topics, err)
	}
	have := make(map[string]int, len(topics))
	for _, r := range res.Resources {
		if r.Error != nil {
			return nil, fmt.Errorf("kafka: describe configs of %s: %w", r.ResourceName, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName != topicMaxMessageBytes {
				continue
			}
			n, err := strconv.Atoi(e.ConfigValue)
			if err != nil {
				return nil, fmt.Errorf("kafka: topic %s: %s %q: %w", r.ResourceName, topicMaxMessageBytes, e.ConfigValue, err)
			}
			have[r.ResourceName] = n
		}
	}
	for _, t := range topics {
		if _, ok := have[t]; !ok {
			return nil, fmt.Errorf("kafka: describe configs of %s: no %s", t, topicMaxMessageBytes)
		}
	}
	return have, nil
}

// Ping reports whether the job topic's partition leaders answer, for
// readiness checks. It lists their offsets: kafka-go answers metadata
// from a cache, which would not notice a broker that went away. Bounded
// by Config.Timeout.
func (q *Queue) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	parts, err := q.partitions(ctx, q.cfg.Topic)
	if err != nil {
		return err
	}
	_, err = q.bounds(ctx, q.cfg.Topic, parts)
	return err
}

// Enqueue produces the job to Config.Topic keyed by requestID and returns
// once the broker acknowledged it with Config.RequiredAcks. The call is
// bounded by ctx and by Config.WriteTimeout; any failure wraps
// failover.ErrQueueUnavailable (and ctx's error when ctx ended). A job
// whose wait was cut short may still be written by the batch it joined.
func (q *Queue) Enqueue(ctx context.Context, requestID string, body []byte) error {
	if limit := q.MaxJobBytes(); len(body) > limit {
		return fmt.Errorf("kafka: produce %s: job of %d bytes exceeds %d: %w", q.cfg.Topic, len(body), limit, failover.ErrJobTooLarge)
	}
	ctx, cancel := context.WithTimeout(ctx, q.cfg.WriteTimeout)
	defer cancel()
	err := ctx.Err()
	if err == nil {
		err = q.writer.WriteMessages(ctx, kafkago.Message{
			Topic:   q.cfg.Topic,
			Key:     []byte(requestID),
			Value:   body,
			Headers: q.cfg.Tracing.InjectKafka(ctx, nil),
		})
	}
	var tooLarge kafkago.MessageTooLargeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooLarge):
		// The record with its key and headers exceeds the batch limit.
		return fmt.Errorf("kafka: produce %s: %w: %w", q.cfg.Topic, failover.ErrJobTooLarge, err)
	case refusedAsTooLarge(err):
		// The broker refused it: the topic's limit was lowered after
		// EnsureTopics checked it. Other jobs of the batch fail too, so
		// this is not the job's fault alone.
		q.log.Error("kafka broker refused a batch as too large; check the topic's "+topicMaxMessageBytes,
			"topic", q.cfg.Topic, "need", q.cfg.TopicMaxMessageBytes(), "err", err)
	}
	return fmt.Errorf("kafka: produce %s: %w: %w", q.cfg.Topic, failover.ErrQueueUnavailable, err)
}

// Depth returns the backlog: the group's lag summed over the partitions of
// Config.Topic, each the high watermark less the committed offset (the
// log start where nothing is committed). Consumers commit only up to a
// partition's lowest unfinished job, so a job delivered but not settled
// still counts, as in the Redis queue; a finished job behind an unfinished
// one of its partition counts too until that one settles.
func (q *Queue) Depth(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	parts, err := q.partitions(ctx, q.cfg.Topic)
	if err != nil {
		return 0, err
	}
	bounds, err := q.bounds(ctx, q.cfg.Topic, parts)
	if err != nil {
		return 0, err
	}
	res, err := q.client.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{
		GroupID: q.cfg.Group,
		Topics:  map[string][]int{q.cfg.Topic: parts},
	})
	if err == nil {
		err = res.Error
	}
	committed := make(map[int]int64, len(parts))
	switch {
	case errors.Is(err, kafkago.GroupIdNotFound):
		// No member ever joined: nothing is committed, all is backlog.
		return q.lag(parts, bounds, committed), nil
	case err != nil:
		return 0, fmt.Errorf("kafka: fetch offsets of group %s: %w", q.cfg.Group, err)
	}
	for _, p := range res.Topics[q.cfg.Topic] {
		if p.Error != nil {
			return 0, fmt.Errorf("kafka: fetch offsets of group %s partition %d: %w", q.cfg.Group, p.Partition, p.Error)
		}
		committed[p.Partition] = p.CommittedOffset
	}
	return q.lag(parts, bounds, committed), nil
}

// lag sums, over parts, the high watermark less the committed offset.
func (q *Queue) lag(parts []int, bounds map[int]offsetBounds, committed map[int]int64) int64 {
	var lag int64
	for _, p := range parts {
		b := bounds[p]
		from, ok := committed[p]
		if !ok || from < b.first {
			from = b.first // nothing committed (-1), or committed below what retention kept
		}
		lag += max(0, b.last-from)
	}
	return lag
}

// partitions lists the partition ids of topic.
func (q *Queue) partitions(ctx context.Context, topic string) ([]int, error) {
	md, err := q.client.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka: metadata %s: %w", topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("kafka: metadata %s: %w", topic, t.Error)
		}
		parts := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			parts = append(parts, p.ID)
		}
		slices.Sort(parts)
		return parts, nil
	}
	return nil, fmt.Errorf("kafka: metadata %s: %w", topic, kafkago.UnknownTopicOrPartition)
}

// offsetBounds are a partition's log start offset and high watermark.
type offsetBounds struct{ first, last int64 }

// bounds returns the log start offset and high watermark of each partition.
func (q *Queue) bounds(ctx context.Context, topic string, parts []int) (map[int]offsetBounds, error) {
	reqs := make([]kafkago.OffsetRequest, 0, 2*len(parts))
	for _, p := range parts {
		reqs = append(reqs, kafkago.FirstOffsetOf(p), kafkago.LastOffsetOf(p))
	}
	res, err := q.client.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets %s: %w", topic, err)
	}
	out := make(map[int]offsetBounds, len(parts))
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafka: list offsets %s partition %d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = offsetBounds{first: po.FirstOffset, last: po.LastOffset}
	}
	for _, p := range parts {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("kafka: list offsets %s: no answer for partition %d", topic, p)
		}
	}
	return out, nil
}
