package admin

import (
	"context"
	"errors"
	"time"
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
	// Replays is how often the job was replayed and failed again (Redis
	// Streams; a failed replay's record replaces the one it replayed).
	Replays int
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
