package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// DeadLetter is one record of the dead-letter topic.
type DeadLetter struct {
	// ID is the record's "partition:offset" in the dead-letter topic.
	ID string
	// RequestID is the request id the job was enqueued with (the key).
	RequestID string
	// Body is the job exactly as enqueued.
	Body []byte
	// Reason is the reason given to DeadLetter.
	Reason string
	// Attempt is the delivery attempt that gave up.
	Attempt int
	// SourcePartition and SourceOffset locate the job in the job topic.
	SourcePartition int
	SourceOffset    int64
	// FailedAt is when the job was dead-lettered, by the worker's clock.
	FailedAt time.Time
}

// DeadLetterDepth returns the number of records the dead-letter topic
// holds: per partition, the high watermark less the log start offset.
func (q *Queue) DeadLetterDepth(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	parts, err := q.partitions(ctx, q.cfg.DeadLetterTopic)
	if err != nil {
		return 0, err
	}
	bounds, err := q.bounds(ctx, q.cfg.DeadLetterTopic, parts)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, b := range bounds {
		n += max(0, b.last-b.first)
	}
	return n, nil
}

// DeadLetters returns up to count records of the dead-letter topic, oldest
// first (by record time, then partition and offset). It reads every
// partition from its start, so it is meant for tests and admin tools, not
// for a hot path. Headers that do not parse leave their field zero.
func (q *Queue) DeadLetters(ctx context.Context, count int) ([]DeadLetter, error) {
	if count < 1 {
		return nil, fmt.Errorf("kafka: dead letters: count %d < 1", count)
	}
	topic := q.cfg.DeadLetterTopic
	parts, err := q.partitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	bctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	bounds, err := q.bounds(bctx, topic, parts)
	cancel()
	if err != nil {
		return nil, err
	}
	type stamped struct {
		at        time.Time
		partition int
		offset    int64
		DeadLetter
	}
	var all []stamped
	for _, p := range parts {
		b := bounds[p]
		for off := b.first; off < b.last; {
			fctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
			res, err := q.client.Fetch(fctx, &kafkago.FetchRequest{
				Topic: topic, Partition: p, Offset: off, MinBytes: 1, MaxBytes: int64(max(10<<20, q.cfg.TopicMaxMessageBytes())),
				MaxWait: 100 * time.Millisecond,
			})
			if err == nil {
				err = res.Error
			}
			if err != nil {
				cancel()
				return nil, fmt.Errorf("kafka: fetch %s partition %d offset %d: %w", topic, p, off, err)
			}
			start := off
			for {
				rec, err := res.Records.ReadRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					cancel()
					return nil, fmt.Errorf("kafka: read %s partition %d: %w", topic, p, err)
				}
				if rec.Offset < off {
					continue // a batch may start before the offset asked for
				}
				d, err := parseDeadLetter(p, rec)
				if err != nil {
					cancel()
					return nil, fmt.Errorf("kafka: read %s partition %d offset %d: %w", topic, p, rec.Offset, err)
				}
				all = append(all, stamped{at: rec.Time, partition: p, offset: rec.Offset, DeadLetter: d})
				off = rec.Offset + 1
			}
			cancel()
			if off == start {
				break // nothing readable below the high watermark (e.g. only control records)
			}
		}
	}
	slices.SortStableFunc(all, func(a, b stamped) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
	})
	out := make([]DeadLetter, 0, min(count, len(all)))
	for _, s := range all[:min(count, len(all))] {
		out = append(out, s.DeadLetter)
	}
	return out, nil
}

func parseDeadLetter(partition int, rec *kafkago.Record) (DeadLetter, error) {
	key, err := readBytes(rec.Key)
	if err != nil {
		return DeadLetter{}, err
	}
	body, err := readBytes(rec.Value)
	if err != nil {
		return DeadLetter{}, err
	}
	d := DeadLetter{ID: deliveryID(partition, rec.Offset), RequestID: string(key), Body: body}
	for _, h := range rec.Headers {
		v := string(h.Value)
		switch h.Key {
		case "reason":
			d.Reason = v
		case "attempt":
			d.Attempt, _ = strconv.Atoi(v)
		case "source_partition":
			d.SourcePartition, _ = strconv.Atoi(v)
		case "source_offset":
			d.SourceOffset, _ = strconv.ParseInt(v, 10, 64)
		case "failed_at_ms":
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
				d.FailedAt = time.UnixMilli(ms)
			}
		}
	}
	return d, nil
}

func readBytes(b kafkago.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	out := make([]byte, b.Len())
	if _, err := io.ReadFull(b, out); err != nil {
		return nil, err
	}
	return out, nil
}
