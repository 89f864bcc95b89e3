package redisstream

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// DeadLetter is one record of the dead-letter stream.
type DeadLetter struct {
	// ID is the record's entry id in the dead-letter stream.
	ID string
	// RequestID is the request id the job was enqueued with.
	RequestID string
	// Body is the job exactly as enqueued, when the queue keeps payloads
	// (DEAD_LETTER_KEEP_PAYLOAD); empty otherwise or if the entry had none.
	Body []byte
	// BodySHA1 is the hex SHA-1 of the job as enqueued, kept either way.
	BodySHA1 string
	// BodyBytes is the job's size as enqueued.
	BodyBytes int
	// Reason is the reason given to DeadLetter.
	Reason string
	// Attempt is the delivery attempt that gave up.
	Attempt int
	// SourceID is the job's entry id in the job stream.
	SourceID string
	// FailedAt is when the job was dead-lettered, by the Redis clock.
	FailedAt time.Time
}

// DeadLetterDepth returns the number of records in the dead-letter
// streams of every shard.
func (q *Queue) DeadLetterDepth(ctx context.Context) (int64, error) {
	pipe := q.client.Pipeline()
	lens := make([]*redis.IntCmd, len(q.shards))
	for i, sh := range q.shards {
		lens[i] = pipe.XLen(ctx, sh.deadLetter)
	}
	_, _ = pipe.Exec(ctx)
	var total int64
	for i, c := range lens {
		n, err := c.Result()
		if err != nil {
			return 0, fmt.Errorf("redisstream: xlen %s: %w", q.shards[i].deadLetter, err)
		}
		total += n
	}
	return total, nil
}

// DeadLetters returns up to count records of the dead-letter streams,
// oldest first (by the Redis time they failed at, then shard). Fields that
// do not parse are left zero rather than hiding the record. With several
// shards a record's ID is "<shard>:<entry id>".
func (q *Queue) DeadLetters(ctx context.Context, count int) ([]DeadLetter, error) {
	if count < 1 {
		return nil, fmt.Errorf("redisstream: dead letters: count %d < 1", count)
	}
	var out []DeadLetter
	for i, sh := range q.shards {
		msgs, err := q.client.XRangeN(ctx, sh.deadLetter, "-", "+", int64(count)).Result()
		if err != nil {
			return nil, fmt.Errorf("redisstream: xrange %s: %w", sh.deadLetter, err)
		}
		for _, m := range msgs {
			d := parseDeadLetter(m)
			d.ID = q.shardID(i, m.ID)
			out = append(out, d)
		}
	}
	// Each shard's records are in order already; a stable sort by time
	// interleaves them and keeps each shard's own order on ties.
	slices.SortStableFunc(out, func(a, b DeadLetter) int { return a.FailedAt.Compare(b.FailedAt) })
	return out[:min(count, len(out))], nil
}

func parseDeadLetter(m redis.XMessage) DeadLetter {
	field := func(name string) string {
		s, _ := m.Values[name].(string)
		return s
	}
	d := DeadLetter{
		ID:        m.ID,
		RequestID: field("request_id"),
		Body:      []byte(field("body")),
		Reason:    field("reason"),
		SourceID:  field("source_id"),
		BodySHA1:  field("body_sha1"),
	}
	d.BodyBytes, _ = strconv.Atoi(field("body_bytes"))
	d.Attempt, _ = strconv.Atoi(field("attempt"))
	if ms, err := strconv.ParseInt(field("failed_at_ms"), 10, 64); err == nil {
		d.FailedAt = time.UnixMilli(ms)
	}
	return d
}
