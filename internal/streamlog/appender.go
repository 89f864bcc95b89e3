package streamlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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
	// before it is written: short enough that a resume on another process
	// sees it live, long enough to batch a busy process's chunks.
	DefaultFlushInterval = 5 * time.Millisecond
	// DefaultMaxBatch flushes early when this many events wait. A flush
	// also takes whatever else waits by then, up to backlogBatches times
	// as many, so a backlog is written in fewer, larger pipelines.
	DefaultMaxBatch = 512
	// backlogBatches bounds one flush at this many MaxBatches.
	backlogBatches = 8
	// dropLogEvery is the least time between two log lines about dropped
	// entries; each says how many were dropped since the last.
	dropLogEvery = time.Minute
	// DefaultBuffer is how many events may wait for a flush; when Redis
	// is slower than that, further events are dropped (and counted)
	// rather than slowing every stream down.
	DefaultBuffer = 16384
	// flushTimeout bounds one pipelined write.
	flushTimeout = 5 * time.Second
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

// Validate reports bad values without changing c.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.TTL < time.Second {
		return errors.New("streamlog: TTL must be at least 1s")
	}
	if c.FlushInterval < 0 || c.MaxBatch < 1 || c.Buffer < 1 {
		return errors.New("streamlog: FlushInterval must not be negative, MaxBatch and Buffer positive")
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
// for Redis: they hand the entry to Run's goroutine, which writes what
// accumulated every FlushInterval (or MaxBatch entries) in one pipeline,
// so the cost on a stream's own path is a channel send, not a round trip
// per chunk. Safe for concurrent use.
type Appender struct {
	cfg     Config
	rdb     redis.UniversalClient
	log     *slog.Logger
	in      chan item
	dropped atomic.Int64
	batches atomic.Int64
	// droppedLogged is when a drop was last logged (Unix ns; 0: never).
	droppedLogged atomic.Int64
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
	return &Appender{cfg: cfg, rdb: rdb, log: log, in: make(chan item, cfg.Buffer)}, nil
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

func (a *Appender) put(it item) bool {
	select {
	case a.in <- it:
		return true
	default:
		n := a.dropped.Add(1)
		if a.cfg.OnDrop != nil {
			a.cfg.OnDrop()
		}
		now := time.Now().UnixNano()
		if last := a.droppedLogged.Load(); (last == 0 || now-last >= int64(dropLogEvery)) && a.droppedLogged.CompareAndSwap(last, now) {
			a.log.Warn("stream log behind Redis, entries dropped: a resume of these streams ends at the gap",
				"dropped_total", n, "request_id", it.requestID, "buffer", a.cfg.Buffer)
		}
		return false
	}
}

// Pending is how many entries wait for a flush.
func (a *Appender) Pending() int { return len(a.in) }

// Dropped is how many entries were dropped since the start.
func (a *Appender) Dropped() int64 { return a.dropped.Load() }

// Batches is how many pipelined writes were made since the start.
func (a *Appender) Batches() int64 { return a.batches.Load() }

// Run writes entries until ctx ends, then writes what is still waiting
// and returns. Whoever calls Run owns its goroutine; it must stop after
// every stream that appends has ended.
func (a *Appender) Run(ctx context.Context) {
	batch := make([]item, 0, a.cfg.MaxBatch)
	// The timer runs from the first entry of a batch, so an entry waits
	// at most FlushInterval however busy the process is.
	tick := time.NewTimer(time.Hour)
	tick.Stop()
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
	for {
		select {
		case <-alive:
			a.markAlive(ctx)
		case it := <-a.in:
			if len(batch) == 0 {
				tick.Reset(a.cfg.FlushInterval)
			}
			batch = append(batch, it)
			if len(batch) >= a.cfg.MaxBatch {
				tick.Stop()
				batch = a.flush(ctx, a.drainUpTo(batch, backlogBatches*a.cfg.MaxBatch))
			}
		case <-tick.C:
			batch = a.flush(ctx, a.drainUpTo(batch, backlogBatches*a.cfg.MaxBatch))
		case <-ctx.Done():
			tick.Stop()
			a.flush(ctx, a.drain(batch))
			return
		}
	}
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

// drainUpTo appends to batch what is waiting, without waiting, until
// batch holds max entries.
func (a *Appender) drainUpTo(batch []item, max int) []item {
	for len(batch) < max {
		select {
		case it := <-a.in:
			batch = append(batch, it)
		default:
			return batch
		}
	}
	return batch
}

// drain appends to batch what is still waiting, without waiting.
func (a *Appender) drain(batch []item) []item {
	for {
		select {
		case it := <-a.in:
			batch = append(batch, it)
		default:
			return batch
		}
	}
}

// flush writes batch in one pipeline: per log touched, an XADD for its
// owner entry if it is in batch, one for each run of its events (a batch
// entry, or a plain one for a single event) and a PEXPIRE. It returns
// batch emptied for reuse.
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
	for _, id := range logs {
		key := Key(a.cfg.Prefix, id)
		idx := byLog[id]
		for j := 0; j < len(idx); {
			it := batch[idx[j]]
			if it.owner != "" {
				values := []any{fieldOwner, it.owner}
				if a.cfg.Liveness > 0 {
					values = append(values, fieldProducer, a.cfg.Producer)
				}
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: values})
				j++
				continue
			}
			run = run[:0]
			for ; j < len(idx) && len(run) < maxBatchEvents; j++ {
				next := batch[idx[j]]
				if next.owner != "" || !batchable(next.ev) {
					break
				}
				run = append(run, next.ev)
			}
			switch len(run) {
			case 0:
				// Not batchable: an entry of its own, as ever.
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{
					fieldID, strconv.FormatInt(it.ev.ID, 10), fieldEvent, it.ev.Name, fieldData, it.ev.Data}})
				j++
			case 1:
				ev := run[0]
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{
					fieldID, strconv.FormatInt(ev.ID, 10), fieldEvent, ev.Name, fieldData, ev.Data}})
			default:
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{fieldBatch, appendBatch(nil, run)}})
			}
		}
		pipe.PExpire(ctx, key, a.cfg.TTL)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		a.log.Warn("stream log write failed", "entries", len(batch), "err", fmt.Errorf("streamlog: pipelined xadd: %w", err))
	}
	clear(batch)
	return batch[:0]
}
