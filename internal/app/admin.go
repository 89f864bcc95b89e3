package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admin"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/redact"
	"github.com/spillway-dev/spillway/internal/streamlog"
)

// AdminIO is where spillway-admin reads its confirmation and writes.
type AdminIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// RunAdmin runs one spillway-admin command line (args without the global
// flags) with the queue, result channel and stream log cfg names, and
// returns its exit status (admin.Exit*). It needs a Redis (REDIS_URL,
// REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS): embedded mode keeps its
// dead letters in the api's memory, out of any tool's reach.
//
// Stop order: the command ends (its replays closed), then the stream log
// writes what it still holds, then the queue, the result subscriptions
// and the Redis client close.
func RunAdmin(ctx context.Context, cfg *config.Config, log *slog.Logger, args []string, stdio AdminIO) int {
	fail := func(code int, err error) int {
		fmt.Fprintf(stdio.Stderr, "spillway-admin: %v\n", err)
		return code
	}
	// Help, and a command line that cannot work, need no Redis.
	if code, done := admin.Preflight(args, stdio.Stdout, stdio.Stderr); done {
		return code
	}
	if cfg.Embedded() {
		return fail(admin.ExitUsage, errors.New("no Redis configured (REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS): "+
			"embedded mode keeps its queue inside the api process"))
	}
	rdb, err := NewRedisClient(cfg)
	if err != nil {
		return fail(admin.ExitUsage, err)
	}
	defer rdb.Close()
	store, producer, closeQueue, err := openAdminQueue(ctx, cfg, rdb, log)
	if err != nil {
		return fail(admin.ExitFailed, err)
	}
	defer closeQueue()
	sub, err := results.NewSubscriber(ResultsConfig(cfg), rdb, log)
	if err != nil {
		return fail(admin.ExitFailed, err)
	}
	defer sub.Close()
	gw, err := gateway.New(GatewayConfig(cfg), gateway.Deps{Producer: producer, Results: sub, Canceller: sub, Log: log})
	if err != nil {
		return fail(admin.ExitFailed, err)
	}
	logw, err := streamlog.NewAppender(StreamLogConfig(cfg), rdb, log)
	if err != nil {
		return fail(admin.ExitFailed, err)
	}
	// The appender outlives the command (its own context), so the last
	// events of a replay stopped by SIGINT are still written.
	lctx, stopLog := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { logw.Run(lctx) })
	defer func() { stopLog(); wg.Wait() }()

	depth, _ := producer.(failover.Depther)
	t, err := admin.New(admin.Config{
		Backend: cfg.QueueType, KeepPayload: cfg.DeadLetterKeepPayload,
		OverflowThreshold: int64(cfg.QueueOverflowThreshold), StreamLogTTL: cfg.StreamLogTTL,
	}, admin.Deps{
		Store: store, Spiller: gw, Depth: depth, Log: logw,
		Stdin: stdio.Stdin, Stdout: stdio.Stdout, Stderr: stdio.Stderr, Logger: log,
	})
	if err != nil {
		return fail(admin.ExitFailed, err)
	}
	return t.Run(ctx, args)
}

// openAdminQueue opens the dead letters and the producer of the queue
// QUEUE_TYPE names. The tool joins no consumer group.
func openAdminQueue(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, log *slog.Logger) (admin.Store, failover.Producer, func(), error) {
	switch cfg.QueueType {
	case config.QueueTypeKafka:
		claims, err := kafka.NewRedisClaims(kafka.RedisClaimsConfig{Prefix: cfg.QueuePrefix}, rdb)
		if err != nil {
			return nil, nil, nil, err
		}
		q, err := kafka.New(KafkaConfig(cfg, claims), log.With("component", "kafka"))
		if err != nil {
			return nil, nil, nil, err
		}
		tctx, cancel := context.WithTimeout(ctx, kafkaSetupTimeout)
		defer cancel()
		if err := q.EnsureTopics(tctx); err != nil {
			_ = q.Close()
			return nil, nil, nil, fmt.Errorf("kafka brokers %v: %w", redact.URLs(cfg.KafkaBrokers), err)
		}
		return q, q, func() { _ = q.Close() }, nil
	case config.QueueTypeRedis:
		// The consumer name is never used: the tool only enqueues and
		// reads the dead-letter streams.
		q, err := redisstream.New(RedisStreamConfig(cfg, InstanceName("admin")), rdb)
		if err != nil {
			return nil, nil, nil, err
		}
		return q, q, func() {}, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown QUEUE_TYPE %q", cfg.QueueType)
}

// The queues are the tool's dead-letter stores as they are: a Redis
// Streams queue can delete single records, a Kafka topic cannot.
var (
	_ admin.Store   = (*redisstream.Queue)(nil)
	_ admin.Deleter = (*redisstream.Queue)(nil)
	_ admin.Store   = (*kafka.Queue)(nil)
)
