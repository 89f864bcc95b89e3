package admin

import (
	"context"

	"github.com/spillway-dev/spillway/internal/failover"
)

// Store is the dead-letter queue as the tool uses it, in the queues' own
// method names: *redisstream.Queue and *kafka.Queue are Stores. Safe for
// concurrent use; every call is bounded by its ctx.
//
// DeadLetterPage returns up to count records after cursor ("" for the
// start), oldest first, and the next cursor ("" once nothing is left).
// DeadLetterByID returns one record or an error wrapping
// failover.ErrDeadLetterNotFound. PurgeDeadLetters removes every record
// and returns how many there were.
type Store interface {
	DeadLetterPage(ctx context.Context, cursor string, count int) ([]failover.DeadLetter, string, error)
	DeadLetterByID(ctx context.Context, id string) (failover.DeadLetter, error)
	DeadLetterDepth(ctx context.Context) (int64, error)
	PurgeDeadLetters(ctx context.Context) (int64, error)
}

// Deleter is the optional ability of a Store to delete single records:
// Redis Streams can, a Kafka topic cannot. DeleteDeadLetters returns how
// many of ids existed; an id that cannot name a record is an error
// wrapping failover.ErrDeadLetterNotFound, and then nothing is deleted.
type Deleter interface {
	DeleteDeadLetters(ctx context.Context, ids ...string) (int64, error)
}
