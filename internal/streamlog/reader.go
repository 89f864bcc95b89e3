package streamlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound is returned for a log that does not exist (unknown or
// expired request id), or whose owner entry is missing.
var ErrNotFound = errors.New("streamlog: no such stream")

// ErrMalformed is returned for a log entry that is not what Appender
// writes: the log is outside input once it is in Redis.
var ErrMalformed = errors.New("streamlog: malformed log entry")

// Reader reads stream logs. Safe for concurrent use.
type Reader struct {
	prefix string
	rdb    redis.UniversalClient
}

// NewReader returns a reader on rdb; prefix is QUEUE_PREFIX.
func NewReader(prefix string, rdb redis.UniversalClient) (*Reader, error) {
	if rdb == nil {
		return nil, errors.New("streamlog: a Redis client is required")
	}
	return &Reader{prefix: prefix, rdb: rdb}, nil
}

// Owner returns the identity that started requestID's stream, or
// ErrNotFound.
func (r *Reader) Owner(ctx context.Context, requestID string) (string, error) {
	key := Key(r.prefix, requestID)
	msgs, err := r.rdb.XRangeN(ctx, key, "-", "+", 1).Result()
	if err != nil {
		return "", fmt.Errorf("streamlog: xrange %s: %w", key, err)
	}
	if len(msgs) == 0 {
		return "", ErrNotFound
	}
	owner, ok := msgs[0].Values[fieldOwner].(string)
	if !ok || owner == "" {
		return "", ErrNotFound
	}
	return owner, nil
}

// Cursor is a position in a log: the Redis entry id after which Read
// continues. The zero Cursor is the start.
type Cursor string

// Read returns the events after cur, waiting up to block for one when
// there is none yet (0: do not wait), and the cursor to continue from.
// No events and no error means block passed with nothing new.
func (r *Reader) Read(ctx context.Context, requestID string, cur Cursor, block time.Duration) ([]Event, Cursor, error) {
	key := Key(r.prefix, requestID)
	from := string(cur)
	if from == "" {
		from = "0"
	}
	args := &redis.XReadArgs{Streams: []string{key, from}, Count: 256, Block: -1}
	if block > 0 {
		args.Block = block
	}
	res, err := r.rdb.XRead(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return nil, cur, nil
	}
	if err != nil {
		return nil, cur, fmt.Errorf("streamlog: xread %s: %w", key, err)
	}
	var out []Event
	for _, s := range res {
		for _, m := range s.Messages {
			cur = Cursor(m.ID)
			if _, ok := m.Values[fieldOwner]; ok {
				continue
			}
			if b, ok := m.Values[fieldBatch]; ok {
				bs, _ := b.(string)
				var err error
				if out, err = decodeBatch(bs, out); err != nil {
					return out, cur, fmt.Errorf("streamlog: %s entry %s: %w", key, m.ID, err)
				}
				continue
			}
			ev, err := decode(m.Values)
			if err != nil {
				return out, cur, fmt.Errorf("streamlog: %s entry %s: %w", key, m.ID, err)
			}
			out = append(out, ev)
		}
	}
	return out, cur, nil
}

// decode checks one event entry: a positive id, an event name and data
// that cannot inject SSE fields.
func decode(v map[string]any) (Event, error) {
	idS, _ := v[fieldID].(string)
	name, okN := v[fieldEvent].(string)
	data, okD := v[fieldData].(string)
	id, err := strconv.ParseInt(idS, 10, 64)
	if err != nil || id < 1 || !okN || !okD || data == "" ||
		strings.ContainsAny(name, "\r\n\x00") || strings.ContainsAny(data, "\r\n\x00") {
		return Event{}, ErrMalformed
	}
	return Event{ID: id, Name: name, Data: []byte(data)}, nil
}

// Exists reports whether requestID's log still exists.
func (r *Reader) Exists(ctx context.Context, requestID string) (bool, error) {
	key := Key(r.prefix, requestID)
	n, err := r.rdb.Exists(ctx, key).Result()
	if err != nil {
		return false, fmt.Errorf("streamlog: exists %s: %w", key, err)
	}
	return n == 1, nil
}

// Live reports whether requestID's log still exists and its producer is
// alive: a log whose owner entry names a producer (Config.Producer) is
// live while that producer's marker (ProducerKey) is set; one naming none
// while it exists. False means no more entries will come.
func (r *Reader) Live(ctx context.Context, requestID string) (bool, error) {
	key := Key(r.prefix, requestID)
	msgs, err := r.rdb.XRangeN(ctx, key, "-", "+", 1).Result()
	if err != nil {
		return false, fmt.Errorf("streamlog: xrange %s: %w", key, err)
	}
	if len(msgs) == 0 {
		return false, nil
	}
	producer, _ := msgs[0].Values[fieldProducer].(string)
	if producer == "" {
		return true, nil
	}
	pkey := ProducerKey(r.prefix, producer)
	n, err := r.rdb.Exists(ctx, pkey).Result()
	if err != nil {
		return false, fmt.Errorf("streamlog: exists %s: %w", pkey, err)
	}
	return n == 1, nil
}

// Attach marks requestID's stream as read by a resumed client for ttl;
// the reader refreshes it while it reads.
func (r *Reader) Attach(ctx context.Context, requestID string, ttl time.Duration) error {
	key := ReaderKey(r.prefix, requestID)
	if err := r.rdb.Set(ctx, key, "1", ttl).Err(); err != nil {
		return fmt.Errorf("streamlog: set %s: %w", key, err)
	}
	return nil
}

// Attached reports whether a resumed client reads requestID's stream.
func (r *Reader) Attached(ctx context.Context, requestID string) (bool, error) {
	key := ReaderKey(r.prefix, requestID)
	n, err := r.rdb.Exists(ctx, key).Result()
	if err != nil {
		return false, fmt.Errorf("streamlog: exists %s: %w", key, err)
	}
	return n == 1, nil
}
