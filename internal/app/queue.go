package app

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// Queue is what a process needs of the job queue QUEUE_TYPE names.
type Queue interface {
	failover.Producer
	failover.Depther
	DeadLetterDepth(ctx context.Context) (int64, error)
	// Ping tells readiness whether the queue is reachable.
	Ping(ctx context.Context) error
}

// OpenedQueue is a queue and this process's consumer of it (a Kafka
// consumer joins its group only when it first fetches). Close releases
// what OpenQueue opened, not the Redis client.
type OpenedQueue struct {
	Queue    Queue
	Consumer failover.Consumer
	Close    func()
}

// redisQueue adds Ping to the Redis Streams queue.
type redisQueue struct {
	*redisstream.Queue
	rdb redis.UniversalClient
}

func (q redisQueue) Ping(ctx context.Context) error { return q.rdb.Ping(ctx).Err() }

// OpenQueue opens the queue QUEUE_TYPE names; member is this process's
// name in the consumer group; tel, when on, writes the trace context into
// Kafka record headers.
// Kafka topics are created when missing; a broker that is down at start is
// logged, not fatal: enqueues then fail with 503 until it is back, and the
// direct path keeps serving.
func OpenQueue(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, log *slog.Logger, member string, tel *telemetry.Provider) (*OpenedQueue, error) {
	switch cfg.QueueType {
	case config.QueueTypeKafka:
		claims, err := kafka.NewRedisClaims(kafka.RedisClaimsConfig{Prefix: cfg.QueuePrefix}, rdb)
		if err != nil {
			return nil, err
		}
		kc := KafkaConfig(cfg, claims)
		kc.Tracing = tel
		q, err := kafka.New(kc, log.With("component", "kafka"))
		if err != nil {
			return nil, err
		}
		tctx, cancel := context.WithTimeout(ctx, kafkaSetupTimeout)
		if err := q.EnsureTopics(tctx); err != nil {
			log.Error("kafka topics not ensured; queued requests fail until the brokers answer", "err", err)
		}
		cancel()
		c, err := q.Consumer(member)
		if err != nil {
			_ = q.Close()
			return nil, err
		}
		return &OpenedQueue{Queue: q, Consumer: c, Close: func() { _ = q.Close() }}, nil
	case config.QueueTypeRedis:
		q, err := redisstream.New(RedisStreamConfig(cfg, member), rdb)
		if err != nil {
			return nil, err
		}
		return &OpenedQueue{Queue: redisQueue{Queue: q, rdb: rdb}, Consumer: q, Close: func() {}}, nil
	}
	return nil, fmt.Errorf("app: unknown QUEUE_TYPE %q", cfg.QueueType)
}
