package admin

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
)

// ErrNotFound is what a Store returns, wrapped, for an id that names no
// dead letter.
var ErrNotFound = errors.New("admin: dead letter not found")

// Record is one dead letter as the tool shows it, whatever the backend.
type Record struct {
	// ID names the record to the backend: a stream entry id
	// ("<shard>:<entry id>" with several shards) or "partition:offset".
	ID string
	// RequestID is the request id the job was enqueued with.
	RequestID string
	// Reason is why the worker gave up on the job.
	Reason string
	// Attempt is the delivery attempt that gave up.
	Attempt int
	// FailedAt is when the job was dead-lettered.
	FailedAt time.Time
	// Body is the job as enqueued, or empty when the queue did not keep
	// payloads (DEAD_LETTER_KEEP_PAYLOAD=false) when it was written.
	Body []byte
	// BodySHA1 and BodyBytes describe the job either way.
	BodySHA1  string
	BodyBytes int
	// Source says where the job was in the queue.
	Source string
}

// Store is the dead-letter queue as the tool uses it. Safe for concurrent
// use; every call is bounded by its ctx.
//
// Page returns up to n records after cursor ("" for the start), oldest
// first, and the next cursor ("" once nothing is left). Get returns one
// record or an error wrapping ErrNotFound. Purge removes every record and
// returns how many there were.
type Store interface {
	Page(ctx context.Context, cursor string, n int) ([]Record, string, error)
	Get(ctx context.Context, id string) (Record, error)
	Depth(ctx context.Context) (int64, error)
	Purge(ctx context.Context) (int64, error)
}

// Deleter is the optional ability of a Store to delete single records:
// Redis Streams can, a Kafka topic cannot. Delete returns how many of ids
// existed; an id that cannot name a record is an error wrapping
// ErrNotFound, and then nothing is deleted.
type Deleter interface {
	Delete(ctx context.Context, ids ...string) (int64, error)
}

// RedisStore returns the dead letters of a Redis Streams queue, every
// shard of it.
func RedisStore(q *redisstream.Queue) Store { return redisStore{q} }

type redisStore struct{ q *redisstream.Queue }

var (
	_ Store   = redisStore{}
	_ Deleter = redisStore{}
)

func fromRedis(d redisstream.DeadLetter) Record {
	return Record{ID: d.ID, RequestID: d.RequestID, Reason: d.Reason, Attempt: d.Attempt, FailedAt: d.FailedAt,
		Body: d.Body, BodySHA1: d.BodySHA1, BodyBytes: d.BodyBytes, Source: "job stream entry " + d.SourceID}
}

func (s redisStore) Page(ctx context.Context, cursor string, n int) ([]Record, string, error) {
	dls, next, err := s.q.DeadLetterPage(ctx, cursor, n)
	out := make([]Record, len(dls))
	for i, d := range dls {
		out[i] = fromRedis(d)
	}
	return out, next, err
}

func (s redisStore) Get(ctx context.Context, id string) (Record, error) {
	d, err := s.q.DeadLetterByID(ctx, id)
	if errors.Is(err, redisstream.ErrDeadLetterNotFound) {
		return Record{}, errors.Join(ErrNotFound, err)
	}
	return fromRedis(d), err
}

func (s redisStore) Delete(ctx context.Context, ids ...string) (int64, error) {
	n, err := s.q.DeleteDeadLetters(ctx, ids...)
	if errors.Is(err, redisstream.ErrDeadLetterNotFound) {
		return n, errors.Join(ErrNotFound, err)
	}
	return n, err
}

func (s redisStore) Depth(ctx context.Context) (int64, error) { return s.q.DeadLetterDepth(ctx) }

func (s redisStore) Purge(ctx context.Context) (int64, error) { return s.q.PurgeDeadLetters(ctx) }

// KafkaStore returns the dead letters of a Kafka queue's dead-letter
// topic. It has no Delete: Kafka cannot delete single records.
func KafkaStore(q *kafka.Queue) Store { return kafkaStore{q} }

type kafkaStore struct{ q *kafka.Queue }

var _ Store = kafkaStore{}

func fromKafka(d kafka.DeadLetter) Record {
	return Record{ID: d.ID, RequestID: d.RequestID, Reason: d.Reason, Attempt: d.Attempt, FailedAt: d.FailedAt,
		Body: d.Body, BodySHA1: d.BodySHA1, BodyBytes: d.BodyBytes,
		Source: "job topic partition " + strconv.Itoa(d.SourcePartition) + " offset " + strconv.FormatInt(d.SourceOffset, 10)}
}

func (s kafkaStore) Page(ctx context.Context, cursor string, n int) ([]Record, string, error) {
	dls, next, err := s.q.DeadLetterPage(ctx, cursor, n)
	out := make([]Record, len(dls))
	for i, d := range dls {
		out[i] = fromKafka(d)
	}
	return out, next, err
}

func (s kafkaStore) Get(ctx context.Context, id string) (Record, error) {
	d, err := s.q.DeadLetterByID(ctx, id)
	if errors.Is(err, kafka.ErrDeadLetterNotFound) {
		return Record{}, errors.Join(ErrNotFound, err)
	}
	return fromKafka(d), err
}

func (s kafkaStore) Depth(ctx context.Context) (int64, error) { return s.q.DeadLetterDepth(ctx) }

func (s kafkaStore) Purge(ctx context.Context) (int64, error) { return s.q.PurgeDeadLetters(ctx) }
