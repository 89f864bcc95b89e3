// Package redisstream owns the Redis Streams failover queue: the job
// streams and their consumer group, the order jobs start in (by priority,
// with aging), takeover of idle jobs with XAUTOCLAIM, and the dead-letter
// stream.
//
// Key layout (prefix "queue:" by default): jobs in one stream per
// priority, PriorityStreamKey(prefix, p) (the normal one is
// StreamKey(prefix), as it always was; high and low add ":high" and
// ":low"), entries with fields request_id and body, read by the consumer
// group Config.Group; dead letters in DeadLetterKey(prefix). Acknowledged
// entries are deleted at once and nothing is ever trimmed, so the streams
// hold exactly the backlog and the sum of their XLEN is the queue depth.
//
// Order (docs/QUEUE.md, "Priority order"): a job's place in line is its
// entry time, less PriorityAging for high and plus it for low; Fetch hands
// out the waiting jobs by place (next.lua), so higher priorities start
// first, FIFO within one, and a job counts one level higher for every
// PriorityAging it has waited: low never starves.
//
// Split over Config.Shards streams per priority (QUEUE_SHARDS), or on a
// Redis Cluster, shard i keeps its jobs in ShardPriorityStreamKey(prefix,
// i, p) and its dead letters in ShardDeadLetterKey(prefix, i): all carry
// the hash tag {s<i>}, so the scripts over one shard's streams and the
// dead-letter move stay in one Cluster slot, while the shards spread over
// the Cluster's nodes. A job goes to the shard its request id hashes to;
// every consumer reads every shard, in place order across them; the depth
// is the sum (docs/QUEUE.md).
package redisstream

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/rediserr"
)

// Defaults applied to zero Config fields.
const (
	DefaultPrefix = "queue:"
	DefaultGroup  = "streaming_failover_consumers"
	DefaultBlock  = time.Second
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

// PriorityStreamKey returns the job stream of priority p:
// StreamKey(prefix) for normal (and the zero priority), with ":high" or
// ":low" added for the others.
func PriorityStreamKey(prefix string, p protocol.Priority) string {
	return StreamKey(prefix) + prioritySuffix(p)
}

// ShardPriorityStreamKey returns the job stream of priority p in shard i,
// in the shard's Cluster slot: queue:streaming_requests_failover:{s<i>}
// for normal, queue:streaming_requests_failover:high:{s<i>} for high.
func ShardPriorityStreamKey(prefix string, i int, p protocol.Priority) string {
	return StreamKey(prefix) + prioritySuffix(p) + ":" + shardTag(i)
}

func prioritySuffix(p protocol.Priority) string {
	if p.OrNormal() == protocol.PriorityNormal {
		return ""
	}
	return ":" + string(p)
}

// ShardDeadLetterKey returns the dead-letter stream of shard i, in the
// same Cluster slot as the shard's job streams: queue:dead_letter:{s<i>}.
func ShardDeadLetterKey(prefix string, i int) string {
	return DeadLetterKey(prefix) + ":" + shardTag(i)
}

func shardTag(i int) string { return "{s" + strconv.Itoa(i) + "}" }

// MaxShards bounds Config.Shards (QUEUE_SHARDS).
const MaxShards = 64

// DefaultShards is Config.Shards' default (QUEUE_SHARDS): one stream per
// priority.
const DefaultShards = 1

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
	// milliseconds, at least 1ms. Default failover.DefaultReclaimIdle.
	ReclaimIdle time.Duration
	// ReclaimInterval is how often Fetch looks for idle jobs with
	// XAUTOCLAIM. Default ReclaimIdle/3, between 50ms and 1s.
	ReclaimInterval time.Duration
	// DeadLetterMaxLen bounds the dead-letter stream, approximately
	// (DEAD_LETTER_MAX_LEN). Default 10000.
	DeadLetterMaxLen int64
	// DeadLetterTTL is how long the dead-letter stream lives after its
	// last record (DEAD_LETTER_TTL_HOURS), whole seconds. Default failover.DefaultDeadLetterTTL.
	DeadLetterTTL time.Duration
	// KeepPayload stores the job's body in a dead letter
	// (DEAD_LETTER_KEEP_PAYLOAD); false stores its SHA-1 and size only,
	// so prompts do not pile up in Redis.
	KeepPayload bool
	// PriorityAging is how long a waiting job takes to count one priority
	// level higher (PRIORITY_AGING_SECONDS). Whole milliseconds, at least
	// 1ms. Default protocol.DefaultPriorityAging.
	PriorityAging time.Duration
}

// DefaultDeadLetterMaxLen is DEAD_LETTER_MAX_LEN's default: dead letters
// kept per dead-letter stream.
const DefaultDeadLetterMaxLen = 10000

// Validate reports whether cfg is usable, each field out of range as a
// *bounds.Error. It checks the fields as given: New fills the zero fields
// that have a default before it calls Validate. It does not change cfg.
func (cfg Config) Validate() error {
	errs := []error{
		bounds.AtLeast("DeadLetterMaxLen", cfg.DeadLetterMaxLen, 1),
		bounds.AtLeast("DeadLetterTTL", cfg.DeadLetterTTL, time.Second),
		bounds.AtLeast("Block", cfg.Block, time.Millisecond),
		bounds.AtLeast("ReclaimIdle", cfg.ReclaimIdle, time.Millisecond),
		bounds.AtLeast("Shards", cfg.Shards, 1),
		bounds.AtMost("Shards", cfg.Shards, MaxShards),
		bounds.AtLeast("ShardBlock", cfg.ShardBlock, time.Millisecond),
		bounds.AtLeast("PriorityAging", cfg.PriorityAging, time.Millisecond),
		bounds.AtLeast("ReclaimInterval", cfg.ReclaimInterval, time.Millisecond),
	}
	if cfg.DeadLetterTTL%time.Second != 0 {
		errs = append(errs, fmt.Errorf("DeadLetterTTL %s is not whole seconds", cfg.DeadLetterTTL))
	}
	if cfg.PriorityAging%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("PriorityAging %s is not whole milliseconds", cfg.PriorityAging))
	}
	if cfg.Consumer == "" {
		errs = append(errs, errors.New("Consumer is required"))
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
		cfg.ReclaimIdle = failover.DefaultReclaimIdle
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultShards
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
		cfg.DeadLetterTTL = failover.DefaultDeadLetterTTL
	}
	if cfg.PriorityAging == 0 {
		cfg.PriorityAging = protocol.DefaultPriorityAging
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

	//go:embed next.lua
	nextSource string
	nextScript = redis.NewScript(nextSource)
)

// Queue is the Redis Streams failover queue as seen by one process: the
// producer side, and the consumer-group member named Config.Consumer. Safe
// for concurrent use. It never closes the client it was given.
type Queue struct {
	cfg    Config
	client redis.UniversalClient
	shards []*shard
	lines  []*line // every job stream, shard by shard
	// multi: there are several shards, so delivery ids name theirs
	// ("<i>:<entry id>").
	multi bool
	// cancelPrefix is what next.lua looks up each taken job's cancel key
	// with (failover.CancelKey of Prefix), so the delivery tells the
	// worker whether its client left: on a single Redis only, empty on a
	// Cluster, where the key is in another slot than the job's stream.
	cancelPrefix string

	// The groups are created (idempotently) before the first read and
	// again after a NOGROUP error, e.g. when Redis restarted without its
	// data.
	groupMu    sync.Mutex
	groupReady atomic.Bool

	mu          sync.Mutex
	nextReclaim time.Time // when some Fetch runs XAUTOCLAIM next
	// reclaimer is set by the first Reclaim call: a takeover loop takes
	// idle jobs over from then on, and Fetch no longer does, so every
	// takeover goes through the loop (its priority, its log line).
	reclaimer bool
	nextRead  int // shard a blocking read waits on next
	// held are deliveries a read handed this member beyond what its Fetch
	// could return (jobs that reached several lines at once as a blocking
	// read began); the next Fetch returns them first.
	held []failover.Delivery

	reclaimMu    sync.Mutex // one XAUTOCLAIM round at a time
	nextReclaimL int        // line scanned first by the next reclaim round, guarded by reclaimMu

	acks acker // Acks waiting for a shared call
}

// shard is one shard's job streams, one per priority, with its
// dead-letter stream.
type shard struct {
	index      int
	lines      [3]*line // by protocol.Priority.Rank: low, normal, high
	deadLetter string
}

// line is the job stream of one priority in one shard.
type line struct {
	shard  int
	prio   protocol.Priority
	stream string
	cursor string // XAUTOCLAIM start id, guarded by Queue.reclaimMu
}

var (
	_ failover.Producer         = (*Queue)(nil)
	_ failover.PriorityProducer = (*Queue)(nil)
	_ failover.Depther          = (*Queue)(nil)
	_ failover.Positioner       = (*Queue)(nil)
	_ failover.Consumer         = (*Queue)(nil)
	_ failover.Reclaimer        = (*Queue)(nil)
)

// New returns a Queue using client. It does no I/O: the consumer groups
// are created on first use.
func New(cfg Config, client redis.UniversalClient) (*Queue, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("redisstream: nil client")
	}
	q := &Queue{cfg: cfg, client: client, multi: cfg.Shards > 1}
	_, cluster := client.(*redis.ClusterClient)
	if !cluster {
		q.cancelPrefix = cfg.Prefix
	}
	for i := range cfg.Shards {
		sh := &shard{index: i, deadLetter: DeadLetterKey(cfg.Prefix)}
		if cfg.Shards > 1 || cluster {
			sh.deadLetter = ShardDeadLetterKey(cfg.Prefix, i)
		}
		for _, p := range protocol.Priorities {
			l := &line{shard: i, prio: p, stream: PriorityStreamKey(cfg.Prefix, p), cursor: "0-0"}
			if cfg.Shards > 1 || cluster {
				l.stream = ShardPriorityStreamKey(cfg.Prefix, i, p)
			}
			sh.lines[p.Rank()] = l
			q.lines = append(q.lines, l)
		}
		q.shards = append(q.shards, sh)
	}
	return q, nil
}

// Streams returns the normal-priority job streams, shard 0 first.
func (q *Queue) Streams() []string {
	out := make([]string, len(q.shards))
	for i, sh := range q.shards {
		out[i] = sh.lines[protocol.PriorityNormal.Rank()].stream
	}
	return out
}

// AllStreams returns every job stream: shard 0 first, low, normal and
// high within a shard.
func (q *Queue) AllStreams() []string {
	out := make([]string, len(q.lines))
	for i, l := range q.lines {
		out[i] = l.stream
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

// deliveryID names entry id of line l for Ack, Touch and DeadLetter:
// "[<shard>:][h:|l:]<entry id>", the shard with several shards, h or l for
// the high and low lines. A normal job of a one-shard queue is named by
// its bare entry id.
func (q *Queue) deliveryID(l *line, id string) string {
	switch l.prio {
	case protocol.PriorityHigh:
		id = "h:" + id
	case protocol.PriorityLow:
		id = "l:" + id
	}
	return q.shardID(l.shard, id)
}

// shardID prefixes id with its shard when there are several.
func (q *Queue) shardID(i int, id string) string {
	if !q.multi {
		return id
	}
	return strconv.Itoa(i) + ":" + id
}

// locateShard returns the shard an id of the form "[<shard>:]<rest>"
// names (the shard with several shards) and the rest: a delivery's line
// and entry id, or a dead letter's entry id.
func (q *Queue) locateShard(id string) (*shard, string, error) {
	if !q.multi {
		return q.shards[0], id, nil
	}
	is, rest, ok := strings.Cut(id, ":")
	i, err := strconv.Atoi(is)
	if !ok || err != nil || i < 0 || i >= len(q.shards) || rest == "" {
		return nil, "", fmt.Errorf("redisstream: id %q does not name one of %d shards", id, len(q.shards))
	}
	return q.shards[i], rest, nil
}

// locate returns the line and entry id a delivery id names.
func (q *Queue) locate(deliveryID string) (*line, string, error) {
	sh, rest, err := q.locateShard(deliveryID)
	if err != nil {
		return nil, "", err
	}
	l := sh.lines[protocol.PriorityNormal.Rank()]
	if p, id, ok := strings.Cut(rest, ":"); ok {
		switch p {
		case "h":
			l, rest = sh.lines[protocol.PriorityHigh.Rank()], id
		case "l":
			l, rest = sh.lines[protocol.PriorityLow.Rank()], id
		default:
			rest = ""
		}
	}
	if rest == "" {
		return nil, "", fmt.Errorf("redisstream: delivery id %q names no entry", deliveryID)
	}
	return l, rest, nil
}

// Enqueue appends the job to its shard's normal-priority stream (never
// trimming it). Any failure wraps failover.ErrQueueUnavailable, and ctx's
// error when ctx ended. The call is bounded by ctx as far as the client
// honours it (set ContextTimeoutEnabled on the client for hard bounds on
// a hung server).
func (q *Queue) Enqueue(ctx context.Context, requestID string, body []byte) error {
	return q.EnqueuePriority(ctx, requestID, protocol.PriorityNormal, body)
}

// EnqueuePriority appends the job to its shard's stream of priority prio
// (the zero priority is normal), like Enqueue.
func (q *Queue) EnqueuePriority(ctx context.Context, requestID string, prio protocol.Priority, body []byte) error {
	l := q.shardFor(requestID).lines[prio.Rank()]
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstream: xadd %s: %w: %w", l.stream, failover.ErrQueueUnavailable, err)
	}
	err := q.client.XAdd(ctx, &redis.XAddArgs{
		Stream: l.stream,
		Values: []any{"request_id", requestID, "body", body},
	}).Err()
	if err != nil {
		return fmt.Errorf("redisstream: xadd %s: %w: %w", l.stream, failover.ErrQueueUnavailable, err)
	}
	return nil
}

// ErrNoProgress is returned by Progress when Redis cannot count a
// group's progress (a server before 7.0, a group not created yet, or one
// whose entries-read is unknown after an XSETID).
var ErrNoProgress = errors.New("redisstream: group progress unknown")

// Progress returns the group's entries-read and lag (XINFO GROUPS, Redis
// 7) summed over every job stream: entries ever delivered to the group and
// entries not delivered yet, in one pipeline. Both are exact while only
// acknowledged (so already delivered) entries are deleted, which is how
// this queue trims. The position built on them assumes one line drained
// in order: with priorities (a later job of higher priority passes
// earlier ones) and several shards it is an estimate (docs/QUEUE.md,
// "Queued position").
func (q *Queue) Progress(ctx context.Context) (handed, waiting int64, err error) {
	pipe := q.client.Pipeline()
	cmds := make([]*redis.XInfoGroupsCmd, len(q.lines))
	for i, l := range q.lines {
		cmds[i] = pipe.XInfoGroups(ctx, l.stream)
	}
	_ = rediserr.Exec(ctx, pipe) // each command's error is looked at below
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			var re redis.Error
			if errors.As(err, &re) { // a reply such as "no such key": nothing to count yet
				return 0, 0, fmt.Errorf("redisstream: xinfo groups %s: %w: %w", q.lines[i].stream, ErrNoProgress, err)
			}
			return 0, 0, fmt.Errorf("redisstream: xinfo groups %s: %w", q.lines[i].stream, err)
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
			return 0, 0, fmt.Errorf("redisstream: group %s of %s: %w", q.cfg.Group, q.lines[i].stream, ErrNoProgress)
		}
	}
	return handed, waiting, nil
}

// Depth returns the backlog: the sum of XLEN over every job stream (each
// priority of each shard), read in one pipeline, exact because
// acknowledged entries are deleted.
func (q *Queue) Depth(ctx context.Context) (int64, error) {
	pipe := q.client.Pipeline()
	lens := make([]*redis.IntCmd, len(q.lines))
	for i, l := range q.lines {
		lens[i] = pipe.XLen(ctx, l.stream)
	}
	_ = rediserr.Exec(ctx, pipe) // each command's error is looked at below
	var total int64
	for i, c := range lens {
		n, err := c.Result()
		if err != nil {
			return 0, fmt.Errorf("redisstream: xlen %s: %w", q.lines[i].stream, err)
		}
		total += n
	}
	return total, nil
}

// Waiting returns the jobs no worker has taken yet: the backlog less the
// group's pending (delivered, unacknowledged) entries, over every stream.
// XLEN and XPENDING are read in one pipeline. A missing group means
// nothing was taken.
func (q *Queue) Waiting(ctx context.Context) (int64, error) {
	pipe := q.client.Pipeline()
	xlens := make([]*redis.IntCmd, len(q.lines))
	pendings := make([]*redis.XPendingCmd, len(q.lines))
	for i, l := range q.lines {
		xlens[i] = pipe.XLen(ctx, l.stream)
		pendings[i] = pipe.XPending(ctx, l.stream, q.cfg.Group)
	}
	// Each command's error is looked at below; a pipeline refused as a
	// whole (a rotated password) leaves them without one unless stamped.
	_ = rediserr.Exec(ctx, pipe)
	var total int64
	for i, l := range q.lines {
		n, err := xlens[i].Result()
		if err != nil {
			return 0, fmt.Errorf("redisstream: xlen %s: %w", l.stream, err)
		}
		p, err := pendings[i].Result()
		switch {
		case err != nil && redis.HasErrorPrefix(err, "NOGROUP"):
		case err != nil:
			return 0, fmt.Errorf("redisstream: xpending %s: %w", l.stream, err)
		default:
			n -= p.Count
		}
		total += max(0, n)
	}
	return total, nil
}

// ensureGroup creates the consumer group of every stream at id 0 unless
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
	for _, l := range q.lines {
		err := q.client.XGroupCreateMkStream(ctx, l.stream, q.cfg.Group, "0").Err()
		if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
			return fmt.Errorf("redisstream: xgroup create %s %s: %w", l.stream, q.cfg.Group, err)
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
// otherwise it reads new jobs (Attempt 1) in place order (docs/QUEUE.md,
// "Priority order"), across priorities and shards. An entry without a
// body field is delivered with an empty Body for the worker to
// dead-letter. Redis errors other than a lost group are returned; the
// caller backs off.
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
		if ds := q.takeHeld(ctx, limit); len(ds) > 0 {
			return ds, nil
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
	if q.reclaimer {
		return false, q.cfg.Block
	}
	if now.Before(q.nextReclaim) {
		return false, q.nextReclaim.Sub(now)
	}
	q.nextReclaim = now.Add(q.cfg.ReclaimInterval)
	return true, q.cfg.ReclaimInterval
}

// readTurn returns the shard the next blocking read waits on, and moves
// it on for the one after.
func (q *Queue) readTurn() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := q.nextRead
	q.nextRead = (i + 1) % len(q.shards)
	return i
}

// Reclaim takes over, without blocking, up to limit entries idle for
// ReclaimIdle (their member stopped refreshing its claim), as the reclaim
// round of Fetch does, and ends Fetch's own rounds for good: a worker that
// calls it every ReclaimInterval takes orphans over whatever room it has
// for new jobs (failover.Reclaimer), and only there.
func (q *Queue) Reclaim(ctx context.Context, limit int) ([]failover.Delivery, error) {
	if limit < 1 {
		return nil, fmt.Errorf("redisstream: reclaim: max %d < 1", limit)
	}
	if err := q.ensureGroup(ctx); err != nil {
		return nil, err
	}
	q.mu.Lock()
	q.reclaimer = true
	q.mu.Unlock()
	ds, err := q.reclaim(ctx, limit)
	if err != nil {
		q.noteGroupLost(err)
		return nil, err
	}
	return ds, nil
}

// ReclaimInterval is how often Reclaim should run: Config.ReclaimInterval.
func (q *Queue) ReclaimInterval() time.Duration { return q.cfg.ReclaimInterval }

// reclaim takes over up to limit entries idle for ReclaimIdle, scanning
// the streams from a start that moves on each round. Takeovers are jobs
// that already started once: they are taken as found, not by priority.
func (q *Queue) reclaim(ctx context.Context, limit int) ([]failover.Delivery, error) {
	q.reclaimMu.Lock()
	defer q.reclaimMu.Unlock()
	start := q.nextReclaimL
	q.nextReclaimL = (start + 1) % len(q.lines)
	var ds []failover.Delivery
	for k := range q.lines {
		l := q.lines[(start+k)%len(q.lines)]
		got, err := q.reclaimLine(ctx, l, limit-len(ds))
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

// reclaimLine takes over up to limit idle entries of line l. If Redis
// fails between XAUTOCLAIM and XPENDING the claimed entries are not lost:
// they stay pending and are taken over again after ReclaimIdle.
func (q *Queue) reclaimLine(ctx context.Context, l *line, limit int) ([]failover.Delivery, error) {
	msgs, next, err := q.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream:   l.stream,
		Group:    q.cfg.Group,
		Consumer: q.cfg.Consumer,
		MinIdle:  q.cfg.ReclaimIdle,
		Start:    l.cursor,
		Count:    int64(limit),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstream: xautoclaim %s %s: %w", l.stream, q.cfg.Group, err)
	}
	// A large pending list is scanned across rounds, resuming where the
	// last one stopped; "0-0" means the scan wrapped around.
	l.cursor = next
	if len(msgs) == 0 {
		return nil, nil
	}
	pipe := q.client.Pipeline()
	counts := make([]*redis.XPendingExtCmd, len(msgs))
	for j, m := range msgs {
		counts[j] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: l.stream, Group: q.cfg.Group, Start: m.ID, End: m.ID, Count: 1,
		})
	}
	if err := rediserr.Exec(ctx, pipe); err != nil {
		return nil, fmt.Errorf("redisstream: xpending %s %s: %w", l.stream, q.cfg.Group, err)
	}
	ds := make([]failover.Delivery, 0, len(msgs))
	for j, m := range msgs {
		p := counts[j].Val()
		if len(p) == 0 {
			continue // acknowledged meanwhile by its former holder
		}
		ds = append(ds, failover.Delivery{ID: q.deliveryID(l, m.ID), Body: bodyOf(m), Attempt: int(p[0].RetryCount)})
	}
	return ds, nil
}

// read delivers up to limit waiting jobs in place order, or waits up to
// block for one to arrive.
// With one shard that is one next.lua call that takes them. With several,
// each shard is first asked for its best limit (peek), the answers are
// merged, and each shard with some of the best is asked to take that
// many: two pipelined rounds, since no script spans Cluster slots. When
// nothing waits the read blocks on one shard's lines (the next one each
// time) for at most ShardBlock, like a single shard for Block, with
// XREADGROUP: a blocked read is served by the one line that got a job, so
// each new job wakes one consumer, not every idle one.
func (q *Queue) read(ctx context.Context, limit int, block time.Duration) ([]failover.Delivery, error) {
	if len(q.shards) == 1 {
		js, err := q.next(ctx, q.shards[0], limit, true)
		if err != nil || len(js) > 0 {
			ds := make([]failover.Delivery, len(js))
			for i, j := range js {
				ds[i] = j.d
			}
			return ds, err
		}
		return q.block(ctx, q.shards[0], limit, block)
	}
	type candidate struct {
		shard int
		place int64
		ms    int64
	}
	var cands []candidate
	ns := make([]int, len(q.shards))
	for i := range ns {
		ns[i] = limit
	}
	for i, r := range q.nextMany(ctx, q.shards, ns, false) {
		if r.err != nil {
			return nil, r.err
		}
		for _, j := range r.jobs {
			cands = append(cands, candidate{shard: i, place: j.place, ms: entryMillis(j.id)})
		}
	}
	if len(cands) == 0 {
		return q.block(ctx, q.shards[q.readTurn()], limit, min(block, q.cfg.ShardBlock))
	}
	slices.SortStableFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.place, b.place), cmp.Compare(a.ms, b.ms), cmp.Compare(a.shard, b.shard))
	})
	best := cands[:min(limit, len(cands))]
	counts := make([]int, len(q.shards))
	for _, c := range best {
		counts[c.shard]++
	}
	var from []*shard
	var want []int
	for i, n := range counts {
		if n > 0 {
			from, want = append(from, q.shards[i]), append(want, n)
		}
	}
	taken := make([][]nextJob, len(q.shards))
	var failed error
	for k, r := range q.nextMany(ctx, from, want, true) {
		if r.err != nil {
			failed = cmp.Or(failed, r.err)
		}
		taken[from[k].index] = r.jobs
	}
	// Each shard's jobs come in order: interleave them as the merge did.
	// (Another consumer may have taken some meanwhile; this one then got
	// the shard's next ones, or fewer.)
	var out []failover.Delivery
	for _, c := range best {
		if len(taken[c.shard]) > 0 {
			out = append(out, taken[c.shard][0].d)
			taken[c.shard] = taken[c.shard][1:]
		}
	}
	// What other shards handed over is delivered even when one failed:
	// the jobs are this member's now. The failure comes back next round.
	if len(out) == 0 && failed != nil {
		return nil, failed
	}
	return out, nil
}

// entryMillis is the milliseconds part of a stream entry id.
func entryMillis(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}

// nextJob is one job next.lua named: taken (a delivery) or peeked (its
// place).
type nextJob struct {
	d     failover.Delivery
	id    string
	place int64
}

// next runs next.lua on shard sh for up to n jobs: taken for this
// consumer when take is set, else only peeked.
func (q *Queue) next(ctx context.Context, sh *shard, n int, take bool) ([]nextJob, error) {
	r := q.nextMany(ctx, []*shard{sh}, []int{n}, take)[0]
	return r.jobs, r.err
}

// nextResult is next.lua's answer for one shard.
type nextResult struct {
	jobs []nextJob
	err  error
}

// nextMany runs next.lua on several shards (ns[i] jobs of shards[i]) in
// one pipeline: one round trip however many shards (on a Cluster, one per
// node). A shard whose node has not cached the script yet is run again on
// its own, which loads it.
func (q *Queue) nextMany(ctx context.Context, shards []*shard, ns []int, take bool) []nextResult {
	mode, cancelPrefix := "peek", ""
	if take {
		mode, cancelPrefix = "take", q.cancelPrefix
	}
	args := func(i int) ([]string, []any) {
		sh := shards[i]
		return []string{sh.lines[0].stream, sh.lines[1].stream, sh.lines[2].stream},
			[]any{q.cfg.Group, q.cfg.Consumer, ns[i], q.cfg.PriorityAging.Milliseconds(), mode, cancelPrefix}
	}
	out := make([]nextResult, len(shards))
	cmds := make([]*redis.Cmd, len(shards))
	if len(shards) == 1 {
		keys, a := args(0)
		cmds[0] = nextScript.Run(ctx, q.client, keys, a...)
	} else {
		pipe := q.client.Pipeline()
		for i := range shards {
			keys, a := args(i)
			cmds[i] = nextScript.EvalSha(ctx, pipe, keys, a...)
		}
		_ = rediserr.Exec(ctx, pipe) // each command's error is looked at below
		for i, c := range cmds {
			if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
				keys, a := args(i)
				cmds[i] = nextScript.Run(ctx, q.client, keys, a...)
			}
		}
	}
	for i, c := range cmds {
		out[i] = q.parseNext(c, shards[i], take, mode)
	}
	return out
}

// parseNext reads next.lua's answer for shard sh.
func (q *Queue) parseNext(c *redis.Cmd, sh *shard, take bool, mode string) nextResult {
	items, err := c.Slice()
	if err != nil {
		return nextResult{err: fmt.Errorf("redisstream: next %s of %s: %w", mode, sh.lines[1].stream, err)}
	}
	bad := nextResult{err: fmt.Errorf("redisstream: next %s of %s: unexpected reply %v", mode, sh.lines[1].stream, items)}
	var r nextResult
	for _, it := range items {
		f, ok := it.([]any)
		if !ok || len(f) != 4 {
			return bad
		}
		rank, ok1 := f[0].(int64)
		id, ok2 := f[1].(string)
		gone, ok3 := f[3].(int64)
		if !ok1 || !ok2 || !ok3 || rank < 0 || rank > 2 {
			return bad
		}
		j := nextJob{id: id}
		if take {
			body, _ := f[2].(string)
			j.d = failover.Delivery{ID: q.deliveryID(sh.lines[rank], id), Body: []byte(body), Attempt: 1,
				CancelChecked: gone >= 0, Cancelled: gone > 0}
		} else if j.place, ok = f[2].(int64); !ok {
			return bad
		}
		r.jobs = append(r.jobs, j)
	}
	return r
}

// block waits up to block for a job on any line of shard sh and takes
// it: XREADGROUP BLOCK over the shard's three lines, COUNT 1. A read that
// blocked is served by the one line that got an entry: one job, to one
// waiting consumer. A read that did not block (jobs arrived since next.lua
// looked) gets the first new job of each line that has one; they are
// ordered by place, and what exceeds limit is held for the next Fetch.
func (q *Queue) block(ctx context.Context, sh *shard, limit int, block time.Duration) ([]failover.Delivery, error) {
	streams := []string{sh.lines[0].stream, sh.lines[1].stream, sh.lines[2].stream, ">", ">", ">"}
	res, err := q.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: q.cfg.Group, Consumer: q.cfg.Consumer, Streams: streams, Count: 1, Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("redisstream: xreadgroup %s %s: %w", sh.lines[1].stream, q.cfg.Group, err)
	}
	type got struct {
		d     failover.Delivery
		place int64
	}
	var gs []got
	for _, s := range res {
		for _, l := range sh.lines {
			if l.stream != s.Stream {
				continue
			}
			for _, m := range s.Messages {
				place := entryMillis(m.ID) + int64(1-l.prio.Rank())*q.cfg.PriorityAging.Milliseconds()
				gs = append(gs, got{failover.Delivery{ID: q.deliveryID(l, m.ID), Body: bodyOf(m), Attempt: 1}, place})
			}
		}
	}
	slices.SortStableFunc(gs, func(a, b got) int { return cmp.Compare(a.place, b.place) })
	ds := make([]failover.Delivery, len(gs))
	for i, g := range gs {
		ds[i] = g.d
	}
	if len(ds) > limit {
		q.mu.Lock()
		q.held = append(q.held, ds[limit:]...)
		q.mu.Unlock()
		ds = ds[:limit]
	}
	return ds, nil
}

// takeHeld returns up to limit held deliveries, each touched first, so it
// is still this member's and its idle time starts again; one another
// member took over meanwhile is dropped.
func (q *Queue) takeHeld(ctx context.Context, limit int) []failover.Delivery {
	q.mu.Lock()
	n := min(limit, len(q.held))
	ds := slices.Clone(q.held[:n])
	q.held = q.held[n:]
	q.mu.Unlock()
	out := ds[:0]
	for _, d := range ds {
		if err := q.Touch(ctx, d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

func bodyOf(m redis.XMessage) []byte {
	s, _ := m.Values["body"].(string)
	return []byte(s)
}

// Ack acknowledges and deletes the entry atomically (ack.lua), so the
// stream holds only the backlog, and only while this member holds it: it
// returns an error wrapping ErrClaimLost when another member took the
// entry over.
// Acknowledging an entry that is no longer pending does nothing. Acks
// that come while one is out share the next call (acker).
func (q *Queue) Ack(ctx context.Context, d failover.Delivery) error {
	l, id, err := q.locate(d.ID)
	if err != nil {
		return err
	}
	return q.ack(ctx, l, id)
}

// Touch restarts the entry's idle time while this member holds it
// (XCLAIM to itself with JUSTID, so the delivery count stays), keeping it
// from being taken over. It returns an error wrapping ErrClaimLost when
// this member no longer holds the entry, and never takes it back.
func (q *Queue) Touch(ctx context.Context, d failover.Delivery) error {
	l, id, err := q.locate(d.ID)
	if err != nil {
		return err
	}
	res, err := touchScript.Run(ctx, q.client, []string{l.stream}, q.cfg.Group, q.cfg.Consumer, id).Int()
	if err != nil {
		if q.noteGroupLost(err) {
			return fmt.Errorf("redisstream: touch %s %s: %w: %w", l.stream, id, ErrClaimLost, err)
		}
		return fmt.Errorf("redisstream: touch %s %s: %w", l.stream, id, err)
	}
	switch res {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("redisstream: touch %s %s: not pending: %w", l.stream, id, ErrClaimLost)
	default:
		return fmt.Errorf("redisstream: touch %s %s: held by another consumer: %w", l.stream, id, ErrClaimLost)
	}
}

// DeadLetter atomically records the job in its shard's dead-letter stream
// (fields request_id, body or body_sha1 and body_bytes, reason, attempt,
// source_id, failed_at_ms, copied from the stored entry and stamped with
// Redis time) and acknowledges and deletes it, only while this member holds
// it (else an error wrapping ErrClaimLost). An entry no longer pending is
// not recorded again, so a retry after a lost reply is harmless.
//
// A job replayed from a dead letter (protocol.Job.ReplayOf) that fails
// again replaces that record: the new one counts the replays, and the
// original is deleted in the same script when it is in the same shard
// (always with one shard), else right after. So a replay that keeps
// failing never multiplies a prompt's dead letters.
func (q *Queue) DeadLetter(ctx context.Context, d failover.Delivery, reason string) error {
	l, id, err := q.locate(d.ID)
	if err != nil {
		return err
	}
	keep := "0"
	if q.cfg.KeepPayload {
		keep = "1"
	}
	dl := q.shards[l.shard].deadLetter
	replaces, replays, elsewhere := q.replaced(ctx, d.Body, dl)
	res, err := deadLetterScript.Run(ctx, q.client, []string{l.stream, dl},
		q.cfg.Group, id, reason, strconv.Itoa(d.Attempt), q.cfg.Consumer,
		q.cfg.DeadLetterMaxLen, int64(q.cfg.DeadLetterTTL/time.Second), keep, replays, replaces).Int()
	if err != nil {
		q.noteGroupLost(err)
		return fmt.Errorf("redisstream: dead-letter %s %s to %s: %w", l.stream, id, dl, err)
	}
	if res < 0 {
		return fmt.Errorf("redisstream: dead-letter %s %s: held by another consumer: %w", l.stream, id, ErrClaimLost)
	}
	if res == 1 && elsewhere != "" {
		if _, err := q.DeleteDeadLetters(ctx, elsewhere); err != nil {
			return fmt.Errorf("redisstream: dead-letter %s %s: delete the replayed record %s: %w", l.stream, id, elsewhere, err)
		}
	}
	return nil
}

// replaced reads which dead letter a failing job replaces, if it is a
// replay: the entry to delete with the write when it is in dl, else the
// record id to delete after it, and the replay count to record. A job
// that does not decode, or replays a record no longer there, replaces
// nothing.
func (q *Queue) replaced(ctx context.Context, body []byte, dl string) (sameShard, replays, elsewhere string) {
	var j struct {
		ReplayOf string `json:"replay_of"`
	}
	if json.Unmarshal(body, &j) != nil || j.ReplayOf == "" {
		return "", "0", ""
	}
	orig, err := q.DeadLetterByID(ctx, j.ReplayOf)
	if err != nil {
		// Gone (replayed elsewhere, purged, expired) or unreadable: this
		// failure is recorded as a first one.
		return "", "1", ""
	}
	replays = strconv.Itoa(orig.Replays + 1)
	sh, entry, _ := q.locateDeadLetter(j.ReplayOf)
	if sh.deadLetter == dl {
		return entry, replays, ""
	}
	return "", replays, j.ReplayOf
}
