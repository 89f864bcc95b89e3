package streamlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Field names of a log entry. The first entry of a log holds only
// fieldOwner; every other one is an event.
const (
	fieldOwner = "o"
	fieldID    = "i"
	fieldEvent = "e"
	fieldData  = "d"
)

// fieldProducer, in the owner entry, names the process writing the log
// (Config.Producer).
const fieldProducer = "p"

// Defaults of zero Config fields.
const (
	// DefaultFlushInterval is the longest an event waits in the appender
	// before it is written (STREAM_LOG_FLUSH_MS): what a resumed reader
	// may lag the stream it tails by, half the queued path's own batching
	// of chunks (QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS, 100 ms); long
	// enough that a paced stream's entry carries several chunks, not one
	// XADD and one pipeline a chunk: at 50 streams with a chunk every
	// 20 ms this cost Redis 11-14 µs a chunk at 5 ms and 3.6-4.7 at 50 ms
	// (docs/bench-history/2026-11.md, "Stream log, paced").
	DefaultFlushInterval = 50 * time.Millisecond
	// MaxFlushInterval bounds FlushInterval: a resume must still look
	// live.
	MaxFlushInterval = time.Second
	// DefaultTTL is STREAM_LOG_TTL_SECONDS' default; Config.TTL itself is
	// required.
	DefaultTTL = 5 * time.Minute
	// DefaultMaxBatch flushes early when this many events wait: a
	// FlushInterval's worth of chunks at 1,000 paced streams (50,000
	// events/s), so that a busy process's entries carry several chunks
	// too.
	DefaultMaxBatch = 4096
	// dropLogEvery is the least time between two log lines about dropped
	// entries; each says how many were dropped since the last.
	dropLogEvery = time.Minute
	// DefaultBuffer is how many events may wait for a write besides the
	// one under way; the next write takes them all. Only beyond that are
	// events dropped (and counted) rather than slowing every stream down:
	// at the 73,000 events/s of one api at 200 concurrent, about a second
	// of a Redis that does not answer (docs/bench-history/2026-11.md, "Stream log at
	// load"). The buffer grows with use; an idle one holds nothing.
	DefaultBuffer = 65536
	// flushTimeout bounds one pipelined write.
	flushTimeout = 5 * time.Second
	// keepBatch is the largest batch slice kept for reuse after a write;
	// one grown by a backlog beyond it goes to the collector.
	keepBatch = 2 * DefaultMaxBatch
	// compactBelow is the most bytes of entries a finished log may hold
	// to be compacted: well within one 4 KB listpack node, so the rewrite
	// costs Redis little, and a larger log's unused tail is a small part
	// of it.
	compactBelow = 3000
	// entryOverhead approximates what Redis adds to an entry's value (its
	// id, field name and lengths) for compactBelow.
	entryOverhead = 16
)

// Config configures an Appender. Zero fields marked with a default take
// it; the others are required.
type Config struct {
	// Prefix is QUEUE_PREFIX.
	Prefix string
	// TTL is how long a log lives after its last write
	// (STREAM_LOG_TTL_SECONDS). Required.
	TTL time.Duration
	// FlushInterval, MaxBatch and Buffer tune batching; see the defaults.
	// FlushInterval is STREAM_LOG_FLUSH_MS, at most MaxFlushInterval.
	FlushInterval time.Duration
	MaxBatch      int
	Buffer        int
	// OnDrop, if not nil, is called for every entry dropped (a metric).
	OnDrop func()
	// Producer names this process in the logs it opens, and Liveness is
	// the TTL of its liveness marker (ProducerKey), which Run refreshes
	// every Liveness/3 and deletes when it returns: a resume of a log
	// whose producer died ends within Liveness of the death
	// (Reader.Live). Zero Liveness writes no marker and names no producer,
	// and a resume of such a log waits for the log's TTL. Liveness, when
	// set, is at least 3ms and needs a Producer.
	Producer string
	Liveness time.Duration
}

func (c Config) withDefaults() Config {
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultBuffer
	}
	return c
}

// Validate reports bad values without changing c; TTL or FlushInterval
// out of range is a *bounds.Error (a zero FlushInterval takes its
// default).
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := errors.Join(bounds.AtLeast("TTL", c.TTL, time.Second),
		bounds.AtLeast("FlushInterval", c.FlushInterval, time.Millisecond),
		bounds.AtMost("FlushInterval", c.FlushInterval, MaxFlushInterval)); err != nil {
		return fmt.Errorf("streamlog: %w", err)
	}
	if c.MaxBatch < 1 || c.Buffer < 1 {
		return errors.New("streamlog: MaxBatch and Buffer must be positive")
	}
	if c.Liveness != 0 && (c.Liveness < 3*time.Millisecond || c.Producer == "") {
		return fmt.Errorf("streamlog: Liveness %s must be 0, or at least 3ms with a Producer", c.Liveness)
	}
	return nil
}

// Event is one event as a client was sent it. ID is the SSE id (1, 2, 3,
// … over the whole stream); Name is empty for a chunk; Data is the
// event's JSON data on one line.
type Event struct {
	ID   int64
	Name string
	Data []byte
}

// item is one write waiting for a flush: an owner entry or an event.
type item struct {
	requestID string
	owner     string // set for the owner entry
	ev        Event
}

// Appender writes stream logs for one process. Append and Open never wait
// for Redis: they add the entry to a buffer that Run writes every
// FlushInterval (or MaxBatch entries) in one pipeline, so the cost on a
// stream's own path is an append under a lock, not a round trip per
// chunk. Safe for concurrent use.
type Appender struct {
	cfg Config
	rdb redis.UniversalClient
	log *slog.Logger
	// mu guards gather, the entries handed over and not yet taken by a
	// write, in the order they came (so a log's entries stay in order).
	mu     sync.Mutex
	gather []item
	// wake tells Run that gather got its first entry or MaxBatch.
	wake    chan struct{}
	dropped atomic.Int64
	batches atomic.Int64
	// pending is how many entries were handed over and not written yet.
	pending atomic.Int64
	// droppedLogged is when a drop was last logged (Unix ns; 0: never).
	droppedLogged atomic.Int64
	// logs is what the writer knows of the logs whose stream has not
	// ended; pruned is when those idle for expireEvery were last
	// forgotten. Only the goroutine writing uses them (Run's writer, then
	// Run itself once the writer has ended).
	logs   map[string]logState
	pruned time.Time
	// compactOff, set by that goroutine too when the server refused COPY
	// or RENAME, is until when logs are left as written.
	compactOff time.Time
}

// NewAppender returns an appender on rdb; Run must run for it to write.
func NewAppender(cfg Config, rdb redis.UniversalClient, log *slog.Logger) (*Appender, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil || log == nil {
		return nil, errors.New("streamlog: a Redis client and a logger are required")
	}
	cfg = cfg.withDefaults()
	return &Appender{cfg: cfg, rdb: rdb, log: log, wake: make(chan struct{}, 1),
		logs: make(map[string]logState)}, nil
}

// Open starts requestID's log with its owner's identity. It must come
// before the request's first Append.
func (a *Appender) Open(requestID, owner string) bool {
	return a.put(item{requestID: requestID, owner: owner})
}

// Append adds ev to requestID's log. It reports false when the entry was
// dropped because Redis has fallen too far behind; a resume then ends at
// the gap (Reader reports it).
func (a *Appender) Append(requestID string, ev Event) bool {
	return a.put(item{requestID: requestID, ev: ev})
}

// logState is what the writer knows of a log.
type logState struct {
	expired time.Time // its expiry was last set
	written time.Time // its last write
	// bytes is the size of the entries written since its owner entry;
	// -1 when its owner entry was not seen (written before a prune).
	bytes int
}

func (a *Appender) put(it item) bool {
	a.mu.Lock()
	n := len(a.gather)
	kept := n < a.cfg.Buffer
	if kept {
		a.gather = append(a.gather, it)
		a.pending.Add(1)
	}
	a.mu.Unlock()
	if kept {
		if n == 0 || n+1 == a.cfg.MaxBatch {
			select {
			case a.wake <- struct{}{}:
			default: // Run has been told already
			}
		}
		return true
	}
	dropped := a.dropped.Add(1)
	if a.cfg.OnDrop != nil {
		a.cfg.OnDrop()
	}
	now := time.Now().UnixNano()
	if last := a.droppedLogged.Load(); (last == 0 || now-last >= int64(dropLogEvery)) && a.droppedLogged.CompareAndSwap(last, now) {
		a.log.Warn("stream log behind Redis, entries dropped: a resume of these streams ends at the gap",
			"dropped_total", dropped, "request_id", it.requestID, "buffer", a.cfg.Buffer)
	}
	return false
}

// Pending is how many entries wait to be written.
func (a *Appender) Pending() int { return int(a.pending.Load()) }

// Dropped is how many entries were dropped since the start.
func (a *Appender) Dropped() int64 { return a.dropped.Load() }

// Batches is how many pipelined writes were made since the start.
func (a *Appender) Batches() int64 { return a.batches.Load() }

// Run writes entries until ctx ends, then writes what is still waiting
// and returns. Whoever calls Run owns its goroutine; it must stop after
// every stream that appends has ended.
func (a *Appender) Run(ctx context.Context) {
	// The timer runs from the first entry of a batch, so an entry waits
	// at most FlushInterval however busy the process is, or, while a
	// write is under way, until it returns.
	tick := time.NewTimer(time.Hour)
	tick.Stop()
	ticking := false
	// The liveness marker is set before any log names this producer, and
	// deleted once the last entry is written.
	var alive <-chan time.Time
	if a.cfg.Liveness > 0 {
		a.markAlive(ctx)
		t := time.NewTicker(a.cfg.Liveness / 3)
		defer t.Stop()
		defer a.markGone(ctx)
		alive = t.C
	}
	// One write is under way at a time, on the writer goroutine, so a
	// log's entries reach Redis in order. Meanwhile entries gather (up to
	// Buffer), and go out whole when the write returns: the log keeps up
	// with Redis's throughput however long its round trips
	// (docs/bench-history/2026-11.md, "Stream log at load"). On a stop, the write
	// under way ends, then Run writes the rest itself.
	writes, written := make(chan []item), make(chan []item)
	go func() {
		defer close(written)
		for b := range writes {
			written <- a.flush(ctx, b)
		}
	}()
	var spare []item
	busy, due := false, false
	send := func() {
		b := a.take(spare)
		spare, due = nil, false
		if len(b) == 0 {
			spare = b
			return
		}
		tick.Stop()
		ticking = false
		writes <- b
		busy = true
	}
	for {
		select {
		case <-alive:
			a.markAlive(ctx)
		case <-a.wake:
			switch n := a.gathered(); {
			case n >= a.cfg.MaxBatch:
				due = true
			case n > 0 && !ticking:
				tick.Reset(a.cfg.FlushInterval)
				ticking = true
			}
			if due && !busy {
				send()
			}
		case <-tick.C:
			ticking, due = false, true
			if !busy {
				send()
			}
		case b := <-written:
			busy = false
			if cap(b) <= keepBatch {
				spare = b
			}
			if due {
				send()
			}
		case <-ctx.Done():
			tick.Stop()
			close(writes)
			for range written { // the write under way, if any
			}
			a.flush(ctx, a.take(spare))
			return
		}
	}
}

// gathered is how many entries wait for the next write.
func (a *Appender) gathered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.gather)
}

// take returns the entries gathered, leaving next (emptied) to gather
// into.
func (a *Appender) take(next []item) []item {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.gather
	a.gather = next[:0]
	return b
}

// markAlive sets the producer's liveness marker for Liveness.
func (a *Appender) markAlive(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, min(flushTimeout, a.cfg.Liveness/3))
	defer cancel()
	key := ProducerKey(a.cfg.Prefix, a.cfg.Producer)
	if err := a.rdb.Set(ctx, key, "1", a.cfg.Liveness).Err(); err != nil && ctx.Err() == nil {
		a.log.Warn("stream log liveness marker not refreshed; resumes of this process's streams may end early",
			"key", key, "err", err)
	}
}

// markGone deletes the liveness marker: the process stopped producing.
func (a *Appender) markGone(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	_ = a.rdb.Del(ctx, ProducerKey(a.cfg.Prefix, a.cfg.Producer)).Err() // else it expires
}

// flush writes batch in one pipeline: per log touched, an XADD for its
// owner entry if it is in batch, one for each run of its events (a batch
// entry; a plain one for an event a batch line cannot carry) and, when
// due (expire), a PEXPIRE. It returns batch emptied for reuse.
func (a *Appender) flush(ctx context.Context, batch []item) []item {
	if len(batch) == 0 {
		return batch
	}
	// Its own bound, not the run's context: entries taken from the channel
	// as Run is stopped are written, not dropped with a cancelled pipeline
	// (a tool that exits right after its last event must not lose it).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), flushTimeout)
	defer cancel()
	a.batches.Add(1)
	now := time.Now()
	a.pruneExpiries(now)
	pipe := a.rdb.Pipeline()
	// Each log's items in their order, logs in order of first appearance:
	// a run of events of one log goes out as one batch entry.
	byLog := make(map[string][]int, 8)
	var logs []string
	for i, it := range batch {
		if _, ok := byLog[it.requestID]; !ok {
			logs = append(logs, it.requestID)
		}
		byLog[it.requestID] = append(byLog[it.requestID], i)
	}
	var run []Event
	var compacts []compaction
	for _, id := range logs {
		key := Key(a.cfg.Prefix, id)
		idx := byLog[id]
		opened, ended, size := false, false, 0
		for j := 0; j < len(idx); {
			it := batch[idx[j]]
			if it.owner != "" {
				values := []any{fieldOwner, it.owner}
				if a.cfg.Liveness > 0 {
					values = append(values, fieldProducer, a.cfg.Producer)
				}
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: values})
				opened = true
				size += len(it.owner) + len(a.cfg.Producer)
				j++
				continue
			}
			run = run[:0]
			for ; j < len(idx) && len(run) < maxBatchEvents; j++ {
				next := batch[idx[j]]
				if next.owner != "" || !batchable(next.ev) {
					break
				}
				ended = ended || terminal(next.ev.Name)
				run = append(run, next.ev)
			}
			if len(run) == 0 {
				// Not batchable: an entry of its own, as ever.
				ended = ended || terminal(it.ev.Name)
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{
					fieldID, strconv.FormatInt(it.ev.ID, 10), fieldEvent, it.ev.Name, fieldData, it.ev.Data}})
				size += entryOverhead + len(it.ev.Name) + len(it.ev.Data)
				j++
				continue
			}
			b := appendBatch(nil, run)
			size += entryOverhead + len(b)
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{fieldBatch, b}})
		}
		ttl, expire, compact := a.expire(id, now, opened, ended, size)
		if expire {
			pipe.PExpire(ctx, key, ttl)
		}
		if compact && now.After(a.compactOff) {
			compacts = append(compacts, a.compact(ctx, pipe, key, compactKey(a.cfg.Prefix, id)))
		}
	}
	cmds, _ := pipe.Exec(ctx)
	if err := writeErr(cmds); err != nil {
		// Which expiries were set is unknown: the next write of each log
		// sets its expiry again (and none is compacted; a copy a
		// compaction made before the failure carries its log's expiry).
		clear(a.logs)
		a.log.Warn("stream log write failed", "entries", len(batch), "err", fmt.Errorf("streamlog: pipelined xadd: %w", err))
	} else {
		a.compacted(ctx, compacts, now)
	}
	a.pending.Add(-int64(len(batch)))
	clear(batch)
	return batch[:0]
}

// compactRetry is how long compaction stays off after the server refused
// it: a refusal is usually for good (a Redis before 6.2, a command
// denied), but it may pass (a server over maxmemory refuses the copy).
const compactRetry = 10 * time.Minute

// compaction is the two commands rewriting one log, and their copy.
type compaction struct {
	copy   *redis.IntCmd
	rename *redis.StatusCmd
	tmp    string
}

// compact queues the rewrite of finished log key through tmp on pipe.
//
// A finished log of under compactBelow bytes is rewritten in place, in the
// pipeline that wrote its end: COPY to a key beside it on its slot, which
// allocates each listpack node at its size, without the 4 KB Redis 7.0
// preallocates for a stream's node (most of which a short answer leaves
// unused), then RENAME back: the same entries, ids and TTL (COPY keeps
// the expiry the pipeline set just before). COPY copies memory where
// DUMP and RESTORE serialize, checksum and parse (docs/bench-history/
// 2026-11.md, "Stream log at load" and "Stream log, paced"); two plain
// commands cost Redis less than the script that ran them before
// ("Stream log compaction without a script"). Nothing else writes a
// finished log, so nothing can land between the two. Compacting is worth
// memory, never an error: a log gone meanwhile is left alone, and a
// server that refuses either command (before 6.2, or a managed Redis
// denying it) turns compaction off for compactRetry (compacted).
func (a *Appender) compact(ctx context.Context, pipe redis.Pipeliner, key, tmp string) compaction {
	// Not pipe.Copy: it names a target database, and a client of any
	// database but 0 would copy the log out of its own.
	cp := redis.NewIntCmd(ctx, "copy", key, tmp, "replace")
	_ = pipe.Process(ctx, cp)
	return compaction{copy: cp, rename: pipe.Rename(ctx, tmp, key), tmp: tmp}
}

// compacted reads what the compactions of a write at now answered. A
// refused COPY or RENAME turns compaction off for compactRetry; the copy
// a refused RENAME left is deleted.
func (a *Appender) compacted(ctx context.Context, cs []compaction, now time.Time) {
	for _, c := range cs {
		copied, err := c.copy.Result()
		if err == nil && copied == 0 {
			continue // the log was gone: nothing was copied, the RENAME failed on nothing
		}
		if err == nil {
			if err = c.rename.Err(); err != nil {
				_ = a.rdb.Del(ctx, c.tmp).Err()
			}
		}
		if err != nil && now.After(a.compactOff) {
			a.compactOff = now.Add(compactRetry)
			a.log.Info("stream logs not compacted for a while: the server refused COPY or RENAME",
				"retry_in", compactRetry.String(), "err", err)
		}
	}
}

// writeErr is the first error of a write's commands other than a
// compaction's, whose refusal does not fail the write.
func writeErr(cmds []redis.Cmder) error {
	for _, c := range cmds {
		if name := c.Name(); name == "copy" || name == "rename" {
			continue
		}
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// expireEvery is how often a running stream's log has its expiry set
// again: at most a second, so a log lives at most that long beyond TTL.
func (a *Appender) expireEvery() time.Duration { return min(a.cfg.TTL/10, time.Second) }

// expire decides, for a write of size bytes to log id at now, whether it
// sets the log's expiry and to what, and whether it compacts the log. A
// log's expiry is set with its owner entry, then at most every
// expireEvery to TTL + expireEvery, and to TTL with its terminal event:
// a log lives TTL after a stream's last event, and between TTL and TTL +
// expireEvery after the last write of a stream that stopped without one;
// not one PEXPIRE per write (per chunk of a paced stream). A log that
// ends within compactBelow bytes of entries is compacted (compact).
func (a *Appender) expire(id string, now time.Time, opened, ended bool, size int) (ttl time.Duration, expire, compact bool) {
	st, known := a.logs[id]
	switch {
	case opened:
		st = logState{bytes: size}
	case !known:
		st = logState{bytes: -1}
	case st.bytes >= 0:
		st.bytes += size
	}
	if ended {
		delete(a.logs, id)
		return a.cfg.TTL, true, st.bytes >= 0 && st.bytes <= compactBelow
	}
	st.written = now
	every := a.expireEvery()
	if opened || !known || now.Sub(st.expired) >= every {
		st.expired, ttl, expire = now, a.cfg.TTL+every, true
	}
	a.logs[id] = st
	return ttl, expire, false
}

// pruneExpiries forgets, every expireEvery, the logs not written for that
// long: those of streams that stopped without a terminal event would
// otherwise stay in the map. A log forgotten has its expiry set again
// by its next write, and is not compacted.
func (a *Appender) pruneExpiries(now time.Time) {
	every := a.expireEvery()
	if now.Sub(a.pruned) < every {
		return
	}
	a.pruned = now
	for id, st := range a.logs {
		if now.Sub(st.written) >= every {
			delete(a.logs, id)
		}
	}
}

// terminal reports whether an event of this name ends its stream.
func terminal(name string) bool { return name == protocol.EventDone || name == protocol.EventError }
