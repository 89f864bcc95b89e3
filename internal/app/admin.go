package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admin"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/failover/results"
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
			return nil, nil, nil, fmt.Errorf("kafka brokers %v: %w", cfg.KafkaBrokers, err)
		}
		return kafkaStore{q}, q, func() { _ = q.Close() }, nil
	case config.QueueTypeRedis:
		// The consumer name is never used: the tool only enqueues and
		// reads the dead-letter streams.
		q, err := redisstream.New(RedisStreamConfig(cfg, InstanceName("admin")), rdb)
		if err != nil {
			return nil, nil, nil, err
		}
		return redisStore{q}, q, func() {}, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown QUEUE_TYPE %q", cfg.QueueType)
}

// redisStore is the dead letters of a Redis Streams queue, every shard
// of it.
type redisStore struct{ q *redisstream.Queue }

var (
	_ admin.Store   = redisStore{}
	_ admin.Deleter = redisStore{}
)

func fromRedis(d redisstream.DeadLetter) admin.Record {
	return admin.Record{ID: d.ID, RequestID: d.RequestID, Reason: d.Reason, Attempt: d.Attempt, FailedAt: d.FailedAt,
		Body: d.Body, BodySHA1: d.BodySHA1, BodyBytes: d.BodyBytes, Source: "job stream entry " + d.SourceID, Replays: d.Replays}
}

func (s redisStore) Page(ctx context.Context, cursor string, n int) ([]admin.Record, string, error) {
	dls, next, err := s.q.DeadLetterPage(ctx, cursor, n)
	out := make([]admin.Record, len(dls))
	for i, d := range dls {
		out[i] = fromRedis(d)
	}
	return out, next, err
}

func (s redisStore) Get(ctx context.Context, id string) (admin.Record, error) {
	d, err := s.q.DeadLetterByID(ctx, id)
	if errors.Is(err, redisstream.ErrDeadLetterNotFound) {
		return admin.Record{}, errors.Join(admin.ErrNotFound, err)
	}
	return fromRedis(d), err
}

func (s redisStore) Delete(ctx context.Context, ids ...string) (int64, error) {
	n, err := s.q.DeleteDeadLetters(ctx, ids...)
	if errors.Is(err, redisstream.ErrDeadLetterNotFound) {
		return n, errors.Join(admin.ErrNotFound, err)
	}
	return n, err
}

func (s redisStore) Depth(ctx context.Context) (int64, error) { return s.q.DeadLetterDepth(ctx) }

func (s redisStore) Purge(ctx context.Context) (int64, error) { return s.q.PurgeDeadLetters(ctx) }

// kafkaStore is the dead letters of a Kafka queue's dead-letter topic.
// It has no Delete: Kafka cannot delete single records.
type kafkaStore struct{ q *kafka.Queue }

var _ admin.Store = kafkaStore{}

func fromKafka(d kafka.DeadLetter) admin.Record {
	return admin.Record{ID: d.ID, RequestID: d.RequestID, Reason: d.Reason, Attempt: d.Attempt, FailedAt: d.FailedAt,
		Body: d.Body, BodySHA1: d.BodySHA1, BodyBytes: d.BodyBytes,
		Source: "job topic partition " + strconv.Itoa(d.SourcePartition) + " offset " + strconv.FormatInt(d.SourceOffset, 10)}
}

func (s kafkaStore) Page(ctx context.Context, cursor string, n int) ([]admin.Record, string, error) {
	dls, next, err := s.q.DeadLetterPage(ctx, cursor, n)
	out := make([]admin.Record, len(dls))
	for i, d := range dls {
		out[i] = fromKafka(d)
	}
	return out, next, err
}

func (s kafkaStore) Get(ctx context.Context, id string) (admin.Record, error) {
	d, err := s.q.DeadLetterByID(ctx, id)
	if errors.Is(err, kafka.ErrDeadLetterNotFound) {
		return admin.Record{}, errors.Join(admin.ErrNotFound, err)
	}
	return fromKafka(d), err
}

func (s kafkaStore) Depth(ctx context.Context) (int64, error) { return s.q.DeadLetterDepth(ctx) }

func (s kafkaStore) Purge(ctx context.Context) (int64, error) { return s.q.PurgeDeadLetters(ctx) }
