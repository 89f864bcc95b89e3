package failover

import (
	"errors"
	"time"
)

// ErrDeadLetterNotFound is what every queue backend returns, wrapped, for
// a dead-letter id that names no record (never written, trimmed, expired,
// deleted or purged, or not an id of that backend at all).
var ErrDeadLetterNotFound = errors.New("failover: dead letter not found")

// DeadLetter is one dead-lettered job as every queue backend returns it
// (redisstream, kafka, memqueue) and spillway-admin shows it.
type DeadLetter struct {
	// ID names the record to its backend: a dead-letter stream entry id
	// ("<shard>:<entry id>" with several shards), a dead-letter topic's
	// "partition:offset", or memqueue's position in its list (1 first).
	ID string
	// RequestID is the request id the job was enqueued with.
	RequestID string
	// Body is the job exactly as enqueued, or empty when the queue did not
	// keep payloads (DEAD_LETTER_KEEP_PAYLOAD=false) when it was written.
	Body []byte
	// BodySHA1 is the hex SHA-1 of the job as enqueued, kept either way.
	BodySHA1 string
	// BodyBytes is the job's size as enqueued.
	BodyBytes int
	// Reason is the reason given to Consumer.DeadLetter.
	Reason string
	// Attempt is the delivery attempt that gave up.
	Attempt int
	// Source says where the job was in the queue, for a reader: "job
	// stream entry <id>", "job topic partition <n> offset <m>" or
	// "memqueue delivery <id>".
	Source string
	// FailedAt is when the job was dead-lettered (the Redis clock for
	// Redis Streams, the worker's for Kafka and memqueue).
	FailedAt time.Time
	// Replays is how often the job was replayed and failed again (Redis
	// Streams only: a failed replay's record replaces the one it replayed).
	Replays int
}
