package redisstream

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/rediserr"
)

// DeadLetterDepth returns the number of records in the dead-letter
// streams of every shard.
func (q *Queue) DeadLetterDepth(ctx context.Context) (int64, error) {
	pipe := q.client.Pipeline()
	lens := make([]*redis.IntCmd, len(q.shards))
	for i, sh := range q.shards {
		lens[i] = pipe.XLen(ctx, sh.deadLetter)
	}
	_ = rediserr.Exec(ctx, pipe) // each command's error is looked at below
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
// oldest first: the first page of DeadLetterPage.
func (q *Queue) DeadLetters(ctx context.Context, count int) ([]failover.DeadLetter, error) {
	out, _, err := q.DeadLetterPage(ctx, "", count)
	return out, err
}

// DeadLetterPage returns up to count records of the dead-letter streams
// after cursor ("" for the start), oldest first (by the Redis time they
// failed at, then shard), and the cursor of the next page ("" once no
// record is left after this page). The shards are merged, each read in
// entry order, so every record appears on exactly one page. Fields that do
// not parse are left zero rather than hiding the record. With several
// shards a record's ID is "<shard>:<entry id>". A cursor is opaque: the
// last entry id returned of each shard.
func (q *Queue) DeadLetterPage(ctx context.Context, cursor string, count int) ([]failover.DeadLetter, string, error) {
	if count < 1 {
		return nil, "", fmt.Errorf("redisstream: dead letters: count %d < 1", count)
	}
	after, err := q.parsePageCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	pipe := q.client.Pipeline()
	cmds := make([]*redis.XMessageSliceCmd, len(q.shards))
	for i, sh := range q.shards {
		start := "-"
		if after[i] != "" {
			start = "(" + after[i]
		}
		cmds[i] = pipe.XRangeN(ctx, sh.deadLetter, start, "+", int64(count))
	}
	_ = rediserr.Exec(ctx, pipe) // each command's error is looked at below
	runs := make([][]failover.DeadLetter, len(q.shards))
	for i, c := range cmds {
		msgs, err := c.Result()
		if err != nil {
			return nil, "", fmt.Errorf("redisstream: xrange %s: %w", q.shards[i].deadLetter, err)
		}
		for _, m := range msgs {
			d := parseDeadLetter(m)
			d.ID = q.shardID(i, m.ID)
			runs[i] = append(runs[i], d)
		}
	}
	took := make([]int, len(q.shards))
	var out []failover.DeadLetter
	for len(out) < count {
		best := -1
		for i, run := range runs {
			if took[i] < len(run) && (best < 0 || run[took[i]].FailedAt.Before(runs[best][took[best]].FailedAt)) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out = append(out, runs[best][took[best]])
		took[best]++
	}
	more := false
	next := slices.Clone(after)
	for i, run := range runs {
		if took[i] > 0 {
			_, next[i], _ = q.locateShard(run[took[i]-1].ID)
		}
		// A shard whose read was full may hold more after it.
		if took[i] < len(run) || len(run) == count {
			more = true
		}
	}
	if !more {
		return out, "", nil
	}
	return out, strings.Join(next, ","), nil
}

// parsePageCursor reads one entry id (or nothing) per shard.
func (q *Queue) parsePageCursor(cursor string) ([]string, error) {
	if cursor == "" {
		return make([]string, len(q.shards)), nil
	}
	ids := strings.Split(cursor, ",")
	if len(ids) != len(q.shards) {
		return nil, fmt.Errorf("redisstream: dead-letter cursor %q is not one of %d shards", cursor, len(q.shards))
	}
	for _, id := range ids {
		if id != "" && !validEntryID(id) {
			return nil, fmt.Errorf("redisstream: malformed dead-letter cursor %q", cursor)
		}
	}
	return ids, nil
}

// validEntryID reports whether id is a stream entry id, <ms>-<seq>.
func validEntryID(id string) bool {
	ms, seq, ok := strings.Cut(id, "-")
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return ok && err1 == nil && err2 == nil
}

// locateDeadLetter returns the shard and entry id of a dead-letter id, or
// an error wrapping failover.ErrDeadLetterNotFound when it cannot name one.
func (q *Queue) locateDeadLetter(id string) (*shard, string, error) {
	sh, entry, err := q.locateShard(id)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", failover.ErrDeadLetterNotFound, err)
	}
	if !validEntryID(entry) {
		return nil, "", fmt.Errorf("redisstream: dead letter %q: not an entry id: %w", id, failover.ErrDeadLetterNotFound)
	}
	return sh, entry, nil
}

// DeadLetterByID returns the record id names, or an error wrapping
// failover.ErrDeadLetterNotFound.
func (q *Queue) DeadLetterByID(ctx context.Context, id string) (failover.DeadLetter, error) {
	sh, entry, err := q.locateDeadLetter(id)
	if err != nil {
		return failover.DeadLetter{}, err
	}
	msgs, err := q.client.XRange(ctx, sh.deadLetter, entry, entry).Result()
	if err != nil {
		return failover.DeadLetter{}, fmt.Errorf("redisstream: xrange %s %s: %w", sh.deadLetter, entry, err)
	}
	if len(msgs) == 0 {
		return failover.DeadLetter{}, fmt.Errorf("redisstream: dead letter %s in %s: %w", entry, sh.deadLetter, failover.ErrDeadLetterNotFound)
	}
	d := parseDeadLetter(msgs[0])
	d.ID = id
	return d, nil
}

// DeleteDeadLetters deletes the records ids name (XDEL) and returns how
// many there were; ids naming no record are skipped. A malformed id is an
// error wrapping failover.ErrDeadLetterNotFound, and then nothing is deleted.
func (q *Queue) DeleteDeadLetters(ctx context.Context, ids ...string) (int64, error) {
	byShard := make(map[*shard][]string)
	for _, id := range ids {
		sh, entry, err := q.locateDeadLetter(id)
		if err != nil {
			return 0, err
		}
		byShard[sh] = append(byShard[sh], entry)
	}
	var n int64
	for sh, entries := range byShard {
		d, err := q.client.XDel(ctx, sh.deadLetter, entries...).Result()
		if err != nil {
			return n, fmt.Errorf("redisstream: xdel %s: %w", sh.deadLetter, err)
		}
		n += d
	}
	return n, nil
}

// PurgeDeadLetters deletes the dead-letter stream of every shard and
// returns how many records they held. Each stream's count and deletion
// are one MULTI, so a record written meanwhile is either counted or still
// there.
func (q *Queue) PurgeDeadLetters(ctx context.Context) (int64, error) {
	var n int64
	for _, sh := range q.shards {
		var xlen *redis.IntCmd
		_, err := q.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			xlen = p.XLen(ctx, sh.deadLetter)
			p.Del(ctx, sh.deadLetter)
			return nil
		})
		if err != nil {
			return n, fmt.Errorf("redisstream: purge %s: %w", sh.deadLetter, err)
		}
		n += xlen.Val()
	}
	return n, nil
}

func parseDeadLetter(m redis.XMessage) failover.DeadLetter {
	field := func(name string) string {
		s, _ := m.Values[name].(string)
		return s
	}
	d := failover.DeadLetter{
		ID:        m.ID,
		RequestID: field("request_id"),
		Body:      []byte(field("body")),
		Reason:    field("reason"),
		Source:    "job stream entry " + field("source_id"),
		BodySHA1:  field("body_sha1"),
	}
	d.BodyBytes, _ = strconv.Atoi(field("body_bytes"))
	d.Attempt, _ = strconv.Atoi(field("attempt"))
	d.Replays, _ = strconv.Atoi(field("replays"))
	if ms, err := strconv.ParseInt(field("failed_at_ms"), 10, 64); err == nil {
		d.FailedAt = time.UnixMilli(ms)
	}
	return d
}
