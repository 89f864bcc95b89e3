// Package redisstream owns the Redis Streams failover queue: the job
// stream and its consumer group, takeover of idle jobs with XAUTOCLAIM,
// and the dead-letter stream.
//
// Key layout (prefix "queue:" by default): jobs in the stream
// StreamKey(prefix), entries with fields request_id and body, read by the
// consumer group Config.Group; dead letters in DeadLetterKey(prefix).
// Acknowledged entries are deleted at once and nothing is ever trimmed, so
// the stream holds exactly the backlog and XLEN is the queue depth.
//
// Split over Config.Shards streams (QUEUE_SHARDS), or on a Redis Cluster,
// shard i keeps its jobs in ShardStreamKey(prefix, i) and its dead letters
// in ShardDeadLetterKey(prefix, i): both carry the hash tag {s<i>}, so the
// dead-letter move, one script over the two, stays in one Cluster slot,
// while the shards spread over the Cluster's nodes. A job goes to the
// shard its request id hashes to; every consumer reads every shard; the
// depth is the sum (docs/QUEUE.md).
package redisstream

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
)

// Defaults applied to zero Config fields.
const (
	DefaultPrefix      = "queue:"
	DefaultGroup       = "streaming_failover_consumers"
	DefaultBlock       = time.Second
	DefaultReclaimIdle = 15 * time.Second
)

// ErrClaimLost is returned by Touch when this consumer no longer holds the
// delivery: it was acknowledged, dead-lettered, taken over by another
// member after ReclaimIdle, or lost with Redis. The worker should stop the
// job; whoever holds it now finishes it.
var ErrClaimLost = failover.ErrClaimLost

// StreamKey returns the job stream's key.
func StreamKey(prefix string) string { return prefix + "streaming_requests_failover" }

// DeadLetterKey returns the dead-letter stream's key.
func DeadLetterKey(prefix string) string { return prefix + "dead_letter" }

// ShardStreamKey returns the job stream of shard i of a queue split over
// several streams or kept on a Redis Cluster:
// queue:streaming_requests_failover:{s<i>}.
func ShardStreamKey(prefix string, i int) string {
	return StreamKey(prefix) + ":" + shardTag(i)
}

// ShardDeadLetterKey returns the dead-letter stream of shard i, in the
// same Cluster slot as ShardStreamKey(prefix, i): queue:dead_letter:{s<i>}.
func ShardDeadLetterKey(prefix string, i int) string {
	return DeadLetterKey(prefix) + ":" + shardTag(i)
}

func shardTag(i int) string { return "{s" + strconv.Itoa(i) + "}" }

// MaxShards bounds Config.Shards (QUEUE_SHARDS).
const MaxShards = 64

// DefaultShardBlock bounds each blocking read of one shard while several
// shards are empty: a job arriving on another shard waits at most this
// long for an idle consumer.
const DefaultShardBlock = 50 * time.Millisecond

// Config configures a Queue. Zero fields take the stated defaults.
type Config struct {
	// Prefix starts every key. Default "queue:". A prefix holding a hash
	// tag of its own (e.g. "{queue}:") puts every shard in one Cluster
	// slot: correct, but no longer spread over the nodes.
	Prefix string
	// Shards is how many streams the queue is split over (QUEUE_SHARDS),
	// 1 to MaxShards. With 1 on a single Redis the keys are the unsharded
	// StreamKey and DeadLetterKey; with more, or when the client is a
	// *redis.ClusterClient, the hash-tagged ShardStreamKey and
	// ShardDeadLetterKey. Default 1.
	Shards int
	// ShardBlock bounds the blocking read of one shard when several
	// shards are read (Shards > 1). At least 1ms. Default
	// DefaultShardBlock, at most Block.
	ShardBlock time.Duration
	// Group is the consumer group. Default "streaming_failover_consumers".
	Group string
	// Consumer is this member's name in the group, unique per process
	// (a takeover is from one name to another). Required.
	Consumer string
	// Block bounds each XREADGROUP BLOCK round, and so how long Fetch takes
	// to notice its context ended. At least 1ms. Default 1s.
	Block time.Duration
	// ReclaimIdle is how long a delivered job may go without Touch before
	// another member takes it over (QUEUE_RECLAIM_IDLE_SECONDS). Whole
	// milliseconds, at least 1ms. Default 15s.
	ReclaimIdle time.Duration
	// ReclaimInterval is how often Fetch looks for idle jobs with
	// XAUTOCLAIM. Default ReclaimIdle/3, between 50ms and 1s.
	ReclaimInterval time.Duration
	// DeadLetterMaxLen bounds the dead-letter stream, approximately
	// (DEAD_LETTER_MAX_LEN). Default 10000.
	DeadLetterMaxLen int64
	// DeadLetterTTL is how long the dead-letter stream lives after its
	// last record (DEAD_LETTER_TTL_HOURS), whole seconds. Default 168h.
	DeadLetterTTL time.Duration
	// KeepPayload stores the job's body in a dead letter
	// (DEAD_LETTER_KEEP_PAYLOAD); false stores its SHA-1 and size only,
	// so prompts do not pile up in Redis.
	KeepPayload bool
}

// Dead-letter bounds by default.
const (
	DefaultDeadLetterMaxLen = 10000
	DefaultDeadLetterTTL    = 168 * time.Hour
)

// Validate reports whether cfg is usable. It does not change cfg.
func (cfg Config) Validate() error {
	c := cfg.withDefaults()
	var errs []error
	if cfg.DeadLetterMaxLen < 0 || cfg.DeadLetterTTL < 0 || c.DeadLetterTTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("DeadLetterMaxLen %d must not be negative, DeadLetterTTL %s whole seconds", cfg.DeadLetterMaxLen, cfg.DeadLetterTTL))
	}
	if c.Consumer == "" {
		errs = append(errs, errors.New("Consumer is required"))
	}
	if cfg.Block < 0 || c.Block < time.Millisecond {
		errs = append(errs, fmt.Errorf("Block %s is below 1ms (0 means the default)", cfg.Block))
	}
	if cfg.ReclaimIdle < 0 || c.ReclaimIdle < time.Millisecond {
		errs = append(errs, fmt.Errorf("ReclaimIdle %s is below 1ms (0 means the default)", cfg.ReclaimIdle))
	}
	if cfg.Shards < 0 || c.Shards > MaxShards {
		errs = append(errs, fmt.Errorf("Shards %d is not between 1 and %d (0 means 1)", cfg.Shards, MaxShards))
	}
	if cfg.ShardBlock < 0 || c.ShardBlock < time.Millisecond {
		errs = append(errs, fmt.Errorf("ShardBlock %s is below 1ms (0 means the default)", cfg.ShardBlock))
	}
	if cfg.ReclaimInterval < 0 || c.ReclaimInterval < time.Millisecond {
		errs = append(errs, fmt.Errorf("ReclaimInterval %s is below 1ms (0 means the default)", cfg.ReclaimInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redisstream: config: %w", err)
	}
	return nil
}

func (cfg Config) withDefaults() Config {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.Block == 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.ReclaimIdle == 0 {
		cfg.ReclaimIdle = DefaultReclaimIdle
	}
	if cfg.Shards == 0 {
		cfg.Shards = 1
	}
	if cfg.ShardBlock == 0 {
		cfg.ShardBlock = min(DefaultShardBlock, cfg.Block)
	}
	if cfg.ReclaimInterval == 0 {
		cfg.ReclaimInterval = min(max(cfg.ReclaimIdle/3, 50*time.Millisecond), time.Second)
	}
	if cfg.DeadLetterMaxLen == 0 {
		cfg.DeadLetterMaxLen = DefaultDeadLetterMaxLen
	}
	if cfg.DeadLetterTTL == 0 {
		cfg.DeadLetterTTL = DefaultDeadLetterTTL
	}
	return cfg
}

var (
	//go:embed touch.lua
	touchSource string
	touchScript = redis.NewScript(touchSource)

	//go:embed ack.lua
	ackSource string
	ackScript = redis.NewScript(ackSource)

	//go:embed dead_letter.lua
	deadLetterSource string
	deadLetterScript = redis.NewScript(deadLetterSource)
)

// Queue is the Redis Streams failover queue as seen by one process: the
// producer side, and the consumer-group member named Config.Consumer. Safe
// for concurrent use. It never closes the client it was given.
type Queue struct {
	cfg    Config
	client redis.UniversalClient
	shards []*shard
	// multi: there are several shards, so delivery ids name theirs
	// ("<i>:<entry id>").
	multi bool

	// The groups are created (idempotently) before the first read and
	// again after a NOGROUP error, e.g. when Redis restarted without its
	// data.
	groupMu    sync.Mutex
	groupReady atomic.Bool

	mu          sync.Mutex
	nextReclaim time.Time // when some Fetch runs XAUTOCLAIM next
	nextRead    int       // shard read first by the next Fetch round

	reclaimMu    sync.Mutex // one XAUTOCLAIM round at a time
	nextReclaimS int        // shard scanned first by the next reclaim round, guarded by reclaimMu
}

// shard is one job stream with its dead-letter stream.
type shard struct {
	stream, deadLetter string
	cursor             string // XAUTOCLAIM start id, guarded by Queue.reclaimMu
}

var (
	_ failover.Producer   = (*Queue)(nil)
	_ failover.Depther    = (*Queue)(nil)
	_ failover.Positioner = (*Queue)(nil)
	_ failover.Consumer   = (*Queue)(nil)
)

// New returns a Queue using client. It does no I/O: the consumer groups
// are created on first use.
func New(cfg Config, client redis.UniversalClient) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("redisstream: nil client")
	}
	cfg = cfg.withDefaults()
	q := &Queue{cfg: cfg, client: client, multi: cfg.Shards > 1}
	_, cluster := client.(*redis.ClusterClient)
	for i := range cfg.Shards {
		sh := &shard{stream: StreamKey(cfg.Prefix), deadLetter: DeadLetterKey(cfg.Prefix), cursor: "0-0"}
		if cfg.Shards > 1 || cluster {
			sh.stream, sh.deadLetter = ShardStreamKey(cfg.Prefix, i), ShardDeadLetterKey(cfg.Prefix, i)
		}
		q.shards = append(q.shards, sh)
	}
	return q, nil
}

// Streams returns the job stream keys, shard 0 first.
func (q *Queue) Streams() []string {
	out := make([]string, len(q.shards))
	for i, sh := range q.shards {
		out[i] = sh.stream
	}
	return out
}

// shardFor picks the shard of a request: a hash of its id, so the
// producers of every process agree and the load spreads evenly.
func (q *Queue) shardFor(requestID string) *shard {
	if len(q.shards) == 1 {
		return q.shards[0]
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(requestID))
	return q.shards[h.Sum32()%uint32(len(q.shards))]
}

// deliveryID names entry id of shard i for Ack, Touch and DeadLetter.
func (q *Queue) deliveryID(i int, id string) string {
	if !q.multi {
		return id
	}
	return strconv.Itoa(i) + ":" + id
}

// locate returns the shard and entry id a delivery id names.
func (q *Queue) locate(deliveryID string) (*shard, string, error) {
	if !q.multi {
		return q.shards[0], deliveryID, nil
	}
	is, id, ok := strings.Cut(deliveryID, ":")
	i, err := strconv.Atoi(is)
	if !ok || err != nil || i < 0 || i >= len(q.shards) || id == "" {
		return nil, "", fmt.Errorf("redisstream: delivery id %q does not name one of %d shards", deliveryID, len(q.shards))
	}
	return q.shards[i], id, nil
}

// Enqueue appends the job to its shard's stream (never trimming it). Any
// failure wraps failover.ErrQueueUnavailable, and ctx's error when ctx
// ended. The call is bounded by ctx as far as the client honours it (set
// ContextTimeoutEnabled on the client for hard bounds on a hung server).
func (q *Queue) Enqueue(ctx context.Context, requestID string, body []byte) error {
	sh := q.shardFor(requestID)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstream: xadd %s: %w: %w", sh.stream, failover.ErrQueueUnavailable, err)
	}
	err := q.client.XAdd(ctx, &redis.XAddArgs{
		Stream: sh.stream,
		Values: []any{"request_id", requestID, "body", body},
	}).Err()
	if err != nil {
		return fmt.Errorf("redisstream: xadd %s: %w: %w", sh.stream, failover.ErrQueueUnavailable, err)
	}
	return nil
}

// ErrNoProgress is returned by Progress when Redis cannot count a
// group's progress (a server before 7.0, a group not created yet, or one
// whose entries-read is unknown after an XSETID).
var ErrNoProgress = errors.New("redisstream: group progress unknown")

// Progress returns the group's entries-read and lag (XINFO GROUPS, Redis
// 7) summed over the shards: entries ever delivered to the group and
// entries not delivered yet, in one pipeline. Both are exact while only
// acknowledged (so already delivered) entries are deleted, which is how
// this queue trims; with several shards the position built on them
// assumes the shards drain at one speed (docs/QUEUE.md, "Queued position").
func (q *Queue) Progress(ctx context.Context) (handed, waiting int64, err error) {
	pipe := q.client.Pipeline()
	cmds := make([]*redis.XInfoGroupsCmd, len(q.shards))
	for i, sh := range q.shards {
		cmds[i] = pipe.XInfoGroups(ctx, sh.stream)
	}
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			var re redis.Error
			if errors.As(err, &re) { // a reply such as "no such key": nothing to count yet
				return 0, 0, fmt.Errorf("redisstream: xinfo groups %s: %w: %w", q.shards[i].stream, ErrNoProgress, err)
			}
			return 0, 0, fmt.Errorf("redisstream: xinfo groups %s: %w", q.shards[i].stream, err)
		}
		found := false
		for _, g := range cmd.Val() {
			if g.Name != q.cfg.Group {
				continue
			}
			if g.Lag < 0 || g.EntriesRead < 0 {
				return 0, 0, ErrNoProgress
			}
			handed, waiting, found = handed+g.EntriesRead, waiting+g.Lag, true
		}
		if !found {
			return 0, 0, fmt.Errorf("redisstream: group %s of %s: %w", q.cfg.Group, q.shards[i].stream, ErrNoProgress)
		}
	}
	return handed, waiting, nil
}

// Depth returns the backlog: the sum of XLEN over the shards, exact
// because acknowledged entries are deleted.
func (q *Queue) Depth(ctx context.Context) (int64, error) {
	if len(q.shards) == 1 {
		n, err := q.client.XLen(ctx, q.shards[0].stream).Result()
		if err != nil {
			return 0, fmt.Errorf("redisstream: xlen %s: %w", q.shards[0].stream, err)
		}
		return n, nil
	}
	pipe := q.client.Pipeline()
	lens := make([]*redis.IntCmd, len(q.shards))
	for i, sh := range q.shards {
		lens[i] = pipe.XLen(ctx, sh.stream)
	}
	_, _ = pipe.Exec(ctx)
	var total int64
	for i, c := range lens {
		n, err := c.Result()
		if err != nil {
			return 0, fmt.Errorf("redisstream: xlen %s: %w", q.shards[i].stream, err)
		}
		total += n
	}
	return total, nil
}

// Waiting returns the jobs no worker has taken yet: the backlog less the
// group's pending (delivered, unacknowledged) entries, over every shard.
// XLEN and XPENDING are read in one pipeline. A missing group means
// nothing was taken.
func (q *Queue) Waiting(ctx context.Context) (int64, error) {
	pipe := q.client.Pipeline()
	xlens := make([]*redis.IntCmd, len(q.shards))
	pendings := make([]*redis.XPendingCmd, len(q.shards))
	for i, sh := range q.shards {
		xlens[i] = pipe.XLen(ctx, sh.stream)
		pendings[i] = pipe.XPending(ctx, sh.stream, q.cfg.Group)
	}
	_, _ = pipe.Exec(ctx)
	var total int64
	for i, sh := range q.shards {
		n, err := xlens[i].Result()
		if err != nil {
			return 0, fmt.Errorf("redisstream: xlen %s: %w", sh.stream, err)
		}
		p, err := pendings[i].Result()
		switch {
		case err != nil && redis.HasErrorPrefix(err, "NOGROUP"):
		case err != nil:
			return 0, fmt.Errorf("redisstream: xpending %s: %w", sh.stream, err)
		default:
			n -= p.Count
		}
		total += max(0, n)
	}
	return total, nil
}

// ensureGroup creates the consumer group of every shard at id 0 unless
// this Queue knows they exist. Id 0 is right because acknowledged entries
// are deleted: whatever is in a stream is backlog, including jobs enqueued
// before any consumer ran.
func (q *Queue) ensureGroup(ctx context.Context) error {
	if q.groupReady.Load() {
		return nil
	}
	q.groupMu.Lock()
	defer q.groupMu.Unlock()
	if q.groupReady.Load() {
		return nil
	}
	for _, sh := range q.shards {
		err := q.client.XGroupCreateMkStream(ctx, sh.stream, q.cfg.Group, "0").Err()
		if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
			return fmt.Errorf("redisstream: xgroup create %s %s: %w", sh.stream, q.cfg.Group, err)
		}
	}
	q.groupReady.Store(true)
	return nil
}

// noteGroupLost reports whether err says a group (or a whole stream) is
// gone, and if so makes the next call recreate them.
func (q *Queue) noteGroupLost(err error) bool {
	if redis.HasErrorPrefix(err, "NOGROUP") {
		q.groupReady.Store(false)
		return true
	}
	return false
}

// Fetch returns up to limit deliveries, blocking until there is one or ctx
// ends. Every ReclaimInterval one Fetch of this Queue first takes over
// jobs idle for ReclaimIdle (their Attempt is the entry's delivery count);
// otherwise it reads new jobs (Attempt 1). With several shards each round
// starts at the next shard, so none is starved. An entry without a body
// field is delivered with an empty Body for the worker to dead-letter.
// Redis errors other than a lost group are returned; the caller backs off.
func (q *Queue) Fetch(ctx context.Context, limit int) ([]failover.Delivery, error) {
	if limit < 1 {
		return nil, fmt.Errorf("redisstream: fetch: max %d < 1", limit)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := q.ensureGroup(ctx); err != nil {
			return nil, ctxErrOr(ctx, err)
		}
		due, untilReclaim := q.reclaimTurn(time.Now())
		if due {
			ds, err := q.reclaim(ctx, limit)
			if err != nil {
				if q.noteGroupLost(err) {
					continue
				}
				return nil, ctxErrOr(ctx, err)
			}
			if len(ds) > 0 {
				return ds, nil
			}
		}
		// Block no longer than until the next reclaim round is due, so
		// idle jobs are found on time even while no new job arrives.
		ds, err := q.read(ctx, limit, max(min(q.cfg.Block, untilReclaim), time.Millisecond))
		if err != nil {
			if q.noteGroupLost(err) {
				continue
			}
			return nil, ctxErrOr(ctx, err)
		}
		if len(ds) > 0 {
			return ds, nil
		}
	}
}

// ctxErrOr prefers ctx's error, so Fetch ends with ctx.Err() when the
// client failed only because ctx ended.
func ctxErrOr(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return err
}

// reclaimTurn reports whether the caller should run the reclaim round now
// (and claims it), else how long until the next one is due.
func (q *Queue) reclaimTurn(now time.Time) (bool, time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if now.Before(q.nextReclaim) {
		return false, q.nextReclaim.Sub(now)
	}
	q.nextReclaim = now.Add(q.cfg.ReclaimInterval)
	return true, q.cfg.ReclaimInterval
}

// readTurn returns the shard the next read round starts at, and moves the
// start on for the round after.
func (q *Queue) readTurn() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := q.nextRead
	q.nextRead = (i + 1) % len(q.shards)
	return i
}

// reclaim takes over up to limit entries idle for ReclaimIdle, scanning
// the shards from a start that moves on each round.
func (q *Queue) reclaim(ctx context.Context, limit int) ([]failover.Delivery, error) {
	q.reclaimMu.Lock()
	defer q.reclaimMu.Unlock()
	start := q.nextReclaimS
	q.nextReclaimS = (start + 1) % len(q.shards)
	var ds []failover.Delivery
	for k := range q.shards {
		i := (start + k) % len(q.shards)
		got, err := q.reclaimShard(ctx, i, limit-len(ds))
		if err != nil {
			return nil, err
		}
		ds = append(ds, got...)
		if len(ds) >= limit {
			break
		}
	}
	return ds, nil
}

// reclaimShard takes over up to limit idle entries of shard i. If Redis
// fails between XAUTOCLAIM and XPENDING the claimed entries are not lost:
// they stay pending and are taken over again after ReclaimIdle.
func (q *Queue) reclaimShard(ctx context.Context, i, limit int) ([]failover.Delivery, error) {
	sh := q.shards[i]
	msgs, next, err := q.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream:   sh.stream,
		Group:    q.cfg.Group,
		Consumer: q.cfg.Consumer,
		MinIdle:  q.cfg.ReclaimIdle,
		Start:    sh.cursor,
		Count:    int64(limit),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstream: xautoclaim %s %s: %w", sh.stream, q.cfg.Group, err)
	}
	// A large pending list is scanned across rounds, resuming where the
	// last one stopped; "0-0" means the scan wrapped around.
	sh.cursor = next
	if len(msgs) == 0 {
		return nil, nil
	}
	pipe := q.client.Pipeline()
	counts := make([]*redis.XPendingExtCmd, len(msgs))
	for j, m := range msgs {
		counts[j] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: sh.stream, Group: q.cfg.Group, Start: m.ID, End: m.ID, Count: 1,
		})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("redisstream: xpending %s %s: %w", sh.stream, q.cfg.Group, err)
	}
	ds := make([]failover.Delivery, 0, len(msgs))
	for j, m := range msgs {
		p := counts[j].Val()
		if len(p) == 0 {
			continue // acknowledged meanwhile by its former holder
		}
		ds = append(ds, failover.Delivery{ID: q.deliveryID(i, m.ID), Body: bodyOf(m), Attempt: int(p[0].RetryCount)})
	}
	return ds, nil
}

// read delivers up to limit new entries, blocking up to block. With one
// shard that is one blocking XREADGROUP. With several, one XREADGROUP over
// all of them could return more than limit (COUNT is per stream) and
// cannot span Cluster slots, so the shards are read one by one without
// blocking, starting at a shard that moves on each round, and only when
// all are empty does the round block, on its first shard, for at most
// ShardBlock.
func (q *Queue) read(ctx context.Context, limit int, block time.Duration) ([]failover.Delivery, error) {
	if len(q.shards) == 1 {
		return q.readShard(ctx, 0, limit, block)
	}
	start := q.readTurn()
	var ds []failover.Delivery
	for k := range q.shards {
		i := (start + k) % len(q.shards)
		got, err := q.readShard(ctx, i, limit-len(ds), -1)
		if err != nil {
			return nil, err
		}
		ds = append(ds, got...)
		if len(ds) >= limit {
			return ds, nil
		}
	}
	if len(ds) > 0 {
		return ds, nil
	}
	return q.readShard(ctx, start, limit, min(block, q.cfg.ShardBlock))
}

// readShard delivers up to limit new entries of shard i, blocking up to
// block; a negative block does not block.
func (q *Queue) readShard(ctx context.Context, i, limit int, block time.Duration) ([]failover.Delivery, error) {
	sh := q.shards[i]
	streams, err := q.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group:    q.cfg.Group,
		Consumer: q.cfg.Consumer,
		Streams:  []string{sh.stream, ">"},
		Count:    int64(limit),
		Block:    block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("redisstream: xreadgroup %s %s: %w", sh.stream, q.cfg.Group, err)
	}
	var ds []failover.Delivery
	for _, s := range streams {
		for _, m := range s.Messages {
			ds = append(ds, failover.Delivery{ID: q.deliveryID(i, m.ID), Body: bodyOf(m), Attempt: 1})
		}
	}
	return ds, nil
}

func bodyOf(m redis.XMessage) []byte {
	s, _ := m.Values["body"].(string)
	return []byte(s)
}

// Ack acknowledges and deletes the entry atomically (ack.lua), so the
// stream holds only the backlog, and only while this member holds it: it
// returns an error wrapping ErrClaimLost when another member took the
// entry over.
// Acknowledging an entry that is no longer pending does nothing.
func (q *Queue) Ack(ctx context.Context, d failover.Delivery) error {
	sh, id, err := q.locate(d.ID)
	if err != nil {
		return err
	}
	res, err := ackScript.Run(ctx, q.client, []string{sh.stream}, q.cfg.Group, q.cfg.Consumer, id).Int()
	if err != nil {
		q.noteGroupLost(err)
		return fmt.Errorf("redisstream: ack %s %s: %w", sh.stream, id, err)
	}
	if res < 0 {
		return fmt.Errorf("redisstream: ack %s %s: held by another consumer: %w", sh.stream, id, ErrClaimLost)
	}
	return nil
}

// Touch restarts the entry's idle time while this member holds it
// (XCLAIM to itself with JUSTID, so the delivery count stays), keeping it
// from being taken over. It returns an error wrapping ErrClaimLost when
// this member no longer holds the entry, and never takes it back.
func (q *Queue) Touch(ctx context.Context, d failover.Delivery) error {
	sh, id, err := q.locate(d.ID)
	if err != nil {
		return err
	}
	res, err := touchScript.Run(ctx, q.client, []string{sh.stream}, q.cfg.Group, q.cfg.Consumer, id).Int()
	if err != nil {
		if q.noteGroupLost(err) {
			return fmt.Errorf("redisstream: touch %s %s: %w: %w", sh.stream, id, ErrClaimLost, err)
		}
		return fmt.Errorf("redisstream: touch %s %s: %w", sh.stream, id, err)
	}
	switch res {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("redisstream: touch %s %s: not pending: %w", sh.stream, id, ErrClaimLost)
	default:
		return fmt.Errorf("redisstream: touch %s %s: held by another consumer: %w", sh.stream, id, ErrClaimLost)
	}
}

// DeadLetter atomically records the job in its shard's dead-letter stream
// (fields request_id, body or body_sha1 and body_bytes, reason, attempt,
// source_id, failed_at_ms, copied from the stored entry and stamped with
// Redis time) and acknowledges and deletes it, only while this member holds
// it (else an error wrapping ErrClaimLost). An entry no longer pending is
// not recorded again, so a retry after a lost reply is harmless.
func (q *Queue) DeadLetter(ctx context.Context, d failover.Delivery, reason string) error {
	sh, id, err := q.locate(d.ID)
	if err != nil {
		return err
	}
	keep := "0"
	if q.cfg.KeepPayload {
		keep = "1"
	}
	res, err := deadLetterScript.Run(ctx, q.client, []string{sh.stream, sh.deadLetter},
		q.cfg.Group, id, reason, strconv.Itoa(d.Attempt), q.cfg.Consumer,
		q.cfg.DeadLetterMaxLen, int64(q.cfg.DeadLetterTTL/time.Second), keep).Int()
	if err != nil {
		q.noteGroupLost(err)
		return fmt.Errorf("redisstream: dead-letter %s %s to %s: %w", sh.stream, id, sh.deadLetter, err)
	}
	if res < 0 {
		return fmt.Errorf("redisstream: dead-letter %s %s: held by another consumer: %w", sh.stream, id, ErrClaimLost)
	}
	return nil
}
