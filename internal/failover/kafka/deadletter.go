package kafka

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/spillway-dev/spillway/internal/failover"
)

// deadLetterMessage is the record DeadLetter writes for a job: key the
// request id; value the body when Config.KeepPayload, else empty; headers
// with the reason, the attempt, where the job was, its digest and size,
// and the time.
func (q *Queue) deadLetterMessage(requestID string, body []byte, reason string, attempt, partition int, offset int64) kafkago.Message {
	sum := sha1.Sum(body)
	var value []byte
	if q.cfg.KeepPayload {
		value = body
	}
	return kafkago.Message{
		Topic: q.cfg.DeadLetterTopic,
		Key:   []byte(requestID),
		Value: value,
		Headers: []kafkago.Header{
			{Key: "reason", Value: []byte(truncateUTF8(reason, maxReasonBytes))},
			{Key: "attempt", Value: []byte(strconv.Itoa(attempt))},
			{Key: "source_topic", Value: []byte(q.cfg.Topic)},
			{Key: "source_partition", Value: []byte(strconv.Itoa(partition))},
			{Key: "source_offset", Value: []byte(strconv.FormatInt(offset, 10))},
			{Key: "body_sha1", Value: []byte(hex.EncodeToString(sum[:]))},
			{Key: "body_bytes", Value: []byte(strconv.Itoa(len(body)))},
			{Key: "failed_at_ms", Value: []byte(strconv.FormatInt(time.Now().UnixMilli(), 10))},
		},
	}
}

// retentionConfig is the topic setting DeadLetterRetention maps to.
const retentionConfig = "retention.ms"

// ensureDeadLetterRetention sets the dead-letter topic's retention.ms to
// Config.DeadLetterRetention unless it has that value already. Only that
// one setting is changed (an incremental alter), so settings an operator
// gave the topic otherwise stay.
func (q *Queue) ensureDeadLetterRetention(ctx context.Context) error {
	topic := q.cfg.DeadLetterTopic
	want := strconv.FormatInt(q.cfg.DeadLetterRetention.Milliseconds(), 10)
	got, err := q.topicConfig(ctx, topic, retentionConfig)
	if err != nil {
		return err
	}
	if got == want {
		return nil
	}
	res, err := q.client.IncrementalAlterConfigs(ctx, &kafkago.IncrementalAlterConfigsRequest{
		Resources: []kafkago.IncrementalAlterConfigsRequestResource{{
			ResourceType: kafkago.ResourceTypeTopic,
			ResourceName: topic,
			Configs: []kafkago.IncrementalAlterConfigsRequestConfig{{
				Name: retentionConfig, Value: want, ConfigOperation: kafkago.ConfigOperationSet,
			}},
		}},
	})
	if err == nil {
		for _, r := range res.Resources {
			err = cmp.Or(err, r.Error)
		}
	}
	if err != nil {
		return fmt.Errorf("kafka: set %s of %s to %s: %w", retentionConfig, topic, want, err)
	}
	q.log.Info("kafka dead-letter topic retention set", "topic", topic, retentionConfig, want, "was", got)
	return nil
}

// topicConfig returns the value of one setting of topic ("" when the
// broker does not report it).
func (q *Queue) topicConfig(ctx context.Context, topic, name string) (string, error) {
	res, err := q.client.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{
		Resources: []kafkago.DescribeConfigRequestResource{{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{name},
		}},
	})
	if err != nil {
		return "", fmt.Errorf("kafka: describe configs of %s: %w", topic, err)
	}
	for _, r := range res.Resources {
		if r.Error != nil {
			return "", fmt.Errorf("kafka: describe configs of %s: %w", topic, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName == name {
				return e.ConfigValue, nil
			}
		}
	}
	return "", nil
}

// DeadLetterRetention returns the dead-letter topic's retention.ms as the
// brokers report it, for checks and tools.
func (q *Queue) DeadLetterRetention(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	v, err := q.topicConfig(ctx, q.cfg.DeadLetterTopic, retentionConfig)
	if err != nil {
		return 0, err
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kafka: %s of %s is %q: %w", retentionConfig, q.cfg.DeadLetterTopic, v, err)
	}
	return time.Duration(ms) * time.Millisecond, nil
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
// first (by record time, then partition and offset): the first page of
// DeadLetterPage. Meant for tests and admin tools, not for a hot path.
func (q *Queue) DeadLetters(ctx context.Context, count int) ([]failover.DeadLetter, error) {
	out, _, err := q.DeadLetterPage(ctx, "", count)
	return out, err
}

// stampedRecord is a dead letter with where and when it was written, the
// order pages are merged in.
type stampedRecord struct {
	at        time.Time
	partition int
	offset    int64
	failover.DeadLetter
}

func (a stampedRecord) compare(b stampedRecord) int {
	return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
}

// DeadLetterPage returns up to count records of the dead-letter topic
// after cursor ("" for the start), oldest first, and the cursor of the
// next page ("" when this page reached the end). The partitions are merged
// by record time, each read in offset order, so every record appears on
// exactly one page however the times interleave. A cursor is opaque; it
// holds the next offset of each partition.
func (q *Queue) DeadLetterPage(ctx context.Context, cursor string, count int) ([]failover.DeadLetter, string, error) {
	if count < 1 {
		return nil, "", fmt.Errorf("kafka: dead letters: count %d < 1", count)
	}
	from, err := parsePageCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	topic := q.cfg.DeadLetterTopic
	bctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	parts, err := q.partitions(bctx, topic)
	var bounds map[int]offsetBounds
	if err == nil {
		bounds, err = q.bounds(bctx, topic, parts)
	}
	cancel()
	if err != nil {
		return nil, "", err
	}
	type run struct {
		recs []stampedRecord
		end  int64 // the offset after the last record read
		took int
	}
	runs := make(map[int]*run, len(parts))
	for _, p := range parts {
		start := max(from[p], bounds[p].first)
		recs, end, err := q.readDeadLetters(ctx, p, start, bounds[p].last, count)
		if err != nil {
			return nil, "", err
		}
		runs[p] = &run{recs: recs, end: end}
	}
	var out []failover.DeadLetter
	for len(out) < count {
		best := -1
		for _, p := range parts {
			r := runs[p]
			if r.took == len(r.recs) {
				continue
			}
			if best < 0 || r.recs[r.took].compare(runs[best].recs[runs[best].took]) < 0 {
				best = p
			}
		}
		if best < 0 {
			break
		}
		r := runs[best]
		out = append(out, r.recs[r.took].DeadLetter)
		r.took++
	}
	next := make(map[int]int64, len(parts))
	more := false
	for _, p := range parts {
		r := runs[p]
		if r.took < len(r.recs) {
			next[p] = r.recs[r.took].offset // the first record not on this page
			more = true
			continue
		}
		next[p] = r.end
		if r.end < bounds[p].last {
			more = true
		}
	}
	if !more {
		return out, "", nil
	}
	return out, formatPageCursor(next), nil
}

// readDeadLetters reads up to limit records of partition p of the
// dead-letter topic from offset start, below end, and returns the offset
// to read next (end when the partition was read to it).
func (q *Queue) readDeadLetters(ctx context.Context, p int, start, end int64, limit int) ([]stampedRecord, int64, error) {
	topic := q.cfg.DeadLetterTopic
	var out []stampedRecord
	off := start
	for off < end && len(out) < limit {
		fctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
		res, err := q.client.Fetch(fctx, &kafkago.FetchRequest{
			Topic: topic, Partition: p, Offset: off, MinBytes: 1, MaxBytes: int64(max(10<<20, q.cfg.TopicMaxMessageBytes())), MaxWait: 100 * time.Millisecond,
		})
		if err == nil {
			err = res.Error
		}
		if err != nil {
			cancel()
			return nil, 0, fmt.Errorf("kafka: fetch %s partition %d offset %d: %w", topic, p, off, err)
		}
		before := off
		for len(out) < limit {
			rec, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				cancel()
				return nil, 0, fmt.Errorf("kafka: read %s partition %d: %w", topic, p, err)
			}
			if rec.Offset < off {
				continue // a batch may start before the offset asked for
			}
			if rec.Offset >= end {
				break
			}
			d, err := parseDeadLetter(p, rec)
			if err != nil {
				cancel()
				return nil, 0, fmt.Errorf("kafka: read %s partition %d offset %d: %w", topic, p, rec.Offset, err)
			}
			out = append(out, stampedRecord{at: rec.Time, partition: p, offset: rec.Offset, DeadLetter: d})
			off = rec.Offset + 1
		}
		cancel()
		if off == before {
			// Nothing readable below the high watermark (e.g. only
			// control records): the partition is read to its end.
			return out, end, nil
		}
	}
	if len(out) < limit {
		off = end
	}
	return out, off, nil
}

// DeadLetterByID returns the record id ("partition:offset") names, or an
// error wrapping failover.ErrDeadLetterNotFound.
func (q *Queue) DeadLetterByID(ctx context.Context, id string) (failover.DeadLetter, error) {
	p, off, err := parseDeliveryID(id)
	if err != nil {
		return failover.DeadLetter{}, fmt.Errorf("%w: %w", failover.ErrDeadLetterNotFound, err)
	}
	bctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	parts, err := q.partitions(bctx, q.cfg.DeadLetterTopic)
	var bounds map[int]offsetBounds
	if err == nil && slices.Contains(parts, p) {
		bounds, err = q.bounds(bctx, q.cfg.DeadLetterTopic, []int{p})
	}
	cancel()
	if err != nil {
		return failover.DeadLetter{}, err
	}
	b, ok := bounds[p]
	if !ok || off < b.first || off >= b.last {
		return failover.DeadLetter{}, fmt.Errorf("kafka: dead letter %s: %w", id, failover.ErrDeadLetterNotFound)
	}
	recs, _, err := q.readDeadLetters(ctx, p, off, off+1, 1)
	if err != nil {
		return failover.DeadLetter{}, err
	}
	if len(recs) == 0 || recs[0].offset != off {
		return failover.DeadLetter{}, fmt.Errorf("kafka: dead letter %s: %w", id, failover.ErrDeadLetterNotFound)
	}
	return recs[0].DeadLetter, nil
}

// purgeWait bounds waiting for the brokers to finish deleting the
// dead-letter topic before it is created again.
const purgeWait = 30 * time.Second

// PurgeDeadLetters removes every dead letter: Kafka cannot delete single
// records, so it deletes the dead-letter topic and creates it again with
// Config.Partitions and Config.ReplicationFactor, then runs EnsureTopics
// (retention and the other settings it checks). It returns how many
// records the topic held. A worker dead-lettering meanwhile fails its
// write and leaves the job to come back after ClaimTTL, so nothing is
// lost; processes that cached the topic's metadata see the new topic
// within kafka-go's metadata refresh (6s).
func (q *Queue) PurgeDeadLetters(ctx context.Context) (int64, error) {
	topic := q.cfg.DeadLetterTopic
	n, err := q.DeadLetterDepth(ctx)
	if err != nil {
		return 0, err
	}
	dctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	res, err := q.client.DeleteTopics(dctx, &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	cancel()
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return 0, fmt.Errorf("kafka: delete topic %s: %w", topic, err)
	}
	// A deletion finishes in the background: until it has, creating the
	// topic again answers that it exists. The create is the probe, because
	// kafka-go answers metadata requests from a cache.
	deadline := time.Now().Add(purgeWait)
	for {
		cctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
		res, err := q.client.CreateTopics(cctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{
			Topic: topic, NumPartitions: q.cfg.Partitions, ReplicationFactor: q.cfg.ReplicationFactor,
		}}})
		cancel()
		if err == nil {
			err = res.Errors[topic]
		}
		if err == nil {
			break
		}
		if !errors.Is(err, kafkago.TopicAlreadyExists) {
			return 0, fmt.Errorf("kafka: create %s again after deleting it: %w", topic, err)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("kafka: topic %s still there %s after its deletion: %w", topic, purgeWait, err)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
	}
	if err := q.EnsureTopics(ctx); err != nil {
		return 0, fmt.Errorf("kafka: settings of %s after purging it: %w", topic, err)
	}
	return n, nil
}

// parsePageCursor reads "p:off,p:off"; "" is the start.
func parsePageCursor(cursor string) (map[int]int64, error) {
	out := make(map[int]int64)
	if cursor == "" {
		return out, nil
	}
	for f := range strings.SplitSeq(cursor, ",") {
		p, off, err := parseDeliveryID(f)
		if err != nil {
			return nil, fmt.Errorf("kafka: malformed dead-letter cursor %q", cursor)
		}
		out[p] = off
	}
	return out, nil
}

func formatPageCursor(next map[int]int64) string {
	parts := make([]int, 0, len(next))
	for p := range next {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	fs := make([]string, len(parts))
	for i, p := range parts {
		fs[i] = deliveryID(p, next[p])
	}
	return strings.Join(fs, ",")
}

func parseDeadLetter(partition int, rec *kafkago.Record) (failover.DeadLetter, error) {
	key, err := readBytes(rec.Key)
	if err != nil {
		return failover.DeadLetter{}, err
	}
	body, err := readBytes(rec.Value)
	if err != nil {
		return failover.DeadLetter{}, err
	}
	d := failover.DeadLetter{ID: deliveryID(partition, rec.Offset), RequestID: string(key), Body: body, BodyBytes: -1}
	var srcPartition int
	var srcOffset int64
	for _, h := range rec.Headers {
		v := string(h.Value)
		switch h.Key {
		case "reason":
			d.Reason = v
		case "attempt":
			d.Attempt, _ = strconv.Atoi(v)
		case "source_partition":
			srcPartition, _ = strconv.Atoi(v)
		case "source_offset":
			srcOffset, _ = strconv.ParseInt(v, 10, 64)
		case "body_sha1":
			d.BodySHA1 = v
		case "body_bytes":
			if n, err := strconv.Atoi(v); err == nil {
				d.BodyBytes = n
			}
		case "failed_at_ms":
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
				d.FailedAt = time.UnixMilli(ms)
			}
		}
	}
	d.Source = "job topic partition " + strconv.Itoa(srcPartition) + " offset " + strconv.FormatInt(srcOffset, 10)
	// Records written before the digest headers existed hold the body.
	if d.BodySHA1 == "" && len(body) > 0 {
		sum := sha1.Sum(body)
		d.BodySHA1 = hex.EncodeToString(sum[:])
	}
	if d.BodyBytes < 0 {
		d.BodyBytes = len(body)
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
