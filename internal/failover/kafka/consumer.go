package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// fetchMaxWait is the long-poll of a partition fetch. A generation ends
// only once its partition readers stopped, and a reader notices that only
// between fetches, so this also bounds how long a member delays a
// rebalance.
const fetchMaxWait = 250 * time.Millisecond

// readyBuffer is how many fetched messages wait for a Fetch call.
const readyBuffer = 64

// entryState is where one fetched message stands in this member.
type entryState int

const (
	// queued: fetched from Kafka, waiting in the ready channel.
	stateQueued entryState = iota
	// claiming: a Fetch is asking Claims for it.
	stateClaiming
	// waiting: another member holds its claim, or Claims failed; a Fetch
	// asks again at retryAt.
	stateWaiting
	// inflight: delivered to a worker, not settled.
	stateInflight
	// done: settled here, or found done in Claims; only the commit is left.
	stateDone
	// dropped: forgotten (a queued message of an ended generation).
	stateDropped
)

// entry is one fetched message of a partition. Guarded by Consumer.mu.
type entry struct {
	part      *partition
	offset    int64
	requestID string
	body      []byte
	// trace is the record's trace headers, or traceDropped when they were
	// out of bounds.
	trace        *protocol.TraceContext
	traceDropped bool
	state        entryState
	attempt      int
	retryAt      time.Time
	// bump asks the next successful claim to count a new attempt although
	// the claim is this member's own: its previous delivery ended without
	// being settled (a failed dead-letter write).
	bump bool
}

// partition is this member's view of one partition. Guarded by
// Consumer.mu. Entries stay until committed, so a message fetched again
// after a rebalance is recognised; a partition that moved to another
// member keeps only its unsettled entries.
type partition struct {
	id int
	// gen is the generation in which this member owns the partition, nil
	// while it does not.
	gen *kafkago.Generation
	// committed is the group's committed offset as far as this member
	// knows, -1 for none.
	committed int64
	entries   map[int64]*entry
}

// Consumer is one member of the consumer group: it reads the partitions
// the group assigns to it and implements failover.Consumer on them (see the
// package doc). Create it with Queue.Consumer. Safe for concurrent use.
type Consumer struct {
	q      *Queue
	log    *slog.Logger
	name   string
	member string // claim owner: name plus a random suffix per incarnation

	groupCfg kafkago.ConsumerGroupConfig
	joinMu   sync.Mutex             // guards the three below
	group    *kafkago.ConsumerGroup // nil until the first Fetch
	stop     context.CancelFunc     // ends run's context
	done     chan struct{}          // closed when run has returned

	ready     chan *entry   // fetched messages, in offset order per partition
	wake      chan struct{} // a waiting entry was added outside Fetch
	closing   chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error
	commitSem chan struct{} // one offset commit at a time, so none goes backwards

	mu      sync.Mutex
	gen     *kafkago.Generation // current generation, nil before the first
	parts   map[int]*partition
	waiting map[*entry]struct{}
}

var _ failover.Consumer = (*Consumer)(nil)

// Consumer returns a new member of Config.Group called name (a process's
// worker name, e.g. its hostname). It does no I/O: the member joins the
// group on its first Fetch, so a Consumer that never fetches is never
// assigned partitions. Claims are held under name plus a random suffix, so
// a restarted process with the same name still counts a takeover. Close
// it, or the Queue, to leave the group.
func (q *Queue) Consumer(name string) (*Consumer, error) {
	if name == "" {
		return nil, errors.New("kafka: consumer: empty name")
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:]) // crypto/rand.Read never fails
	c := &Consumer{
		q:         q,
		name:      name,
		member:    name + "-" + hex.EncodeToString(suffix[:]),
		ready:     make(chan *entry, readyBuffer),
		wake:      make(chan struct{}, 1),
		closing:   make(chan struct{}),
		commitSem: make(chan struct{}, 1),
		parts:     make(map[int]*partition),
		waiting:   make(map[*entry]struct{}),
	}
	c.log = q.log.With("component", "kafka-consumer", "member", c.member)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrClosed
	}
	cfg := q.cfg
	c.groupCfg = kafkago.ConsumerGroupConfig{
		ID:                    cfg.Group,
		Brokers:               cfg.Brokers,
		Topics:                []string{cfg.Topic},
		Dialer:                q.dialer(name),
		HeartbeatInterval:     cfg.HeartbeatInterval,
		SessionTimeout:        cfg.SessionTimeout,
		RebalanceTimeout:      cfg.RebalanceTimeout,
		JoinGroupBackoff:      cfg.HeartbeatInterval,
		WatchPartitionChanges: true, // added partitions are picked up
		StartOffset:           kafkago.FirstOffset,
		Timeout:               cfg.Timeout,
		ErrorLogger:           kafkaLogger(c.log, slog.LevelDebug),
	}
	check := c.groupCfg // Validate fills in defaults: check a copy
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("kafka: consumer group %s: %w", cfg.Group, err)
	}
	q.consumers[c] = struct{}{}
	return c, nil
}

// join starts the group membership once; later calls do nothing.
func (c *Consumer) join() error {
	c.joinMu.Lock()
	defer c.joinMu.Unlock()
	if c.group != nil {
		return nil
	}
	select {
	case <-c.closing:
		return ErrClosed
	default:
	}
	group, err := kafkago.NewConsumerGroup(c.groupCfg)
	if err != nil {
		return fmt.Errorf("kafka: consumer group %s: %w", c.groupCfg.ID, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c.group, c.stop, c.done = group, stop, make(chan struct{})
	go c.run(ctx, group, c.done)
	return nil
}

func (q *Queue) dialer(name string) *kafkago.Dialer {
	return &kafkago.Dialer{Timeout: q.cfg.Timeout, ClientID: "spillway-" + name, DualStack: true}
}

// Name returns the member name given to Queue.Consumer.
func (c *Consumer) Name() string { return c.name }

// Close leaves the group, so the group moves this member's partitions to
// the others at once, and stops fetching: Fetch returns ErrClosed. Jobs
// still running are not settled here; they are taken over once their
// claims expire. Ack and DeadLetter of jobs fetched earlier still record
// them as done in Claims while this member holds their claims; without
// Claims they return ErrClaimLost, since the partitions' new owners
// deliver those jobs again. Close waits for the member's goroutines.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() {
		c.joinMu.Lock()
		close(c.closing)
		group, stop, done := c.group, c.stop, c.done
		c.joinMu.Unlock()
		if group != nil {
			stop()
			// Closing the group ends the current generation (its readers
			// stop) and sends LeaveGroup; run then sees ErrGroupClosed.
			if err := group.Close(); err != nil {
				c.closeErr = fmt.Errorf("kafka: leave group %s: %w", c.q.cfg.Group, err)
			}
			<-done
			// Out of the group, this member owns no partition: a job
			// settled from now on is never committed from here.
			c.mu.Lock()
			c.gen = nil
			for _, p := range c.parts {
				p.gen = nil
			}
			c.mu.Unlock()
		}
		c.q.mu.Lock()
		delete(c.q.consumers, c)
		c.q.mu.Unlock()
	})
	return c.closeErr
}

// run follows the group's generations until the group is closed.
func (c *Consumer) run(ctx context.Context, group *kafkago.ConsumerGroup, done chan<- struct{}) {
	defer close(done)
	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafkago.ErrGroupClosed) {
				return
			}
			// The group retries by itself (after JoinGroupBackoff, or at
			// once in a rebalance).
			if errors.Is(err, kafkago.RebalanceInProgress) {
				c.log.Debug("kafka: rebalance in progress", "err", err)
			} else {
				c.log.Warn("kafka: joining the consumer group failed; retrying", "group", c.q.cfg.Group, "err", err)
			}
			continue
		}
		c.startGeneration(ctx, gen)
	}
}

// startGeneration adopts gen's assignment and starts one reader per
// assigned partition, from the committed offset.
func (c *Consumer) startGeneration(ctx context.Context, gen *kafkago.Generation) {
	assigned := gen.Assignments[c.q.cfg.Topic]
	ids := make([]int, 0, len(assigned))
	c.mu.Lock()
	c.gen = gen
	for _, p := range c.parts {
		p.gen = nil
	}
	for _, a := range assigned {
		p := c.parts[a.ID]
		if p == nil {
			p = &partition{id: a.ID, entries: make(map[int64]*entry)}
			c.parts[a.ID] = p
		}
		p.gen = gen
		p.committed = max(a.Offset, -1) // FirstOffset (-2) means nothing committed
		ids = append(ids, a.ID)
	}
	for id, p := range c.parts {
		for off, e := range p.entries {
			switch {
			case e.state == stateQueued:
				// Its reader is gone; the new one fetches it again.
				e.state = stateDropped
				delete(p.entries, off)
			case e.state == stateDone && (p.gen == nil || off < p.committed):
				delete(p.entries, off)
			case e.state == stateWaiting && p.gen == nil:
				// Its new owner decides; nothing of it runs here.
				e.state = stateDropped
				delete(c.waiting, e)
				delete(p.entries, off)
			}
		}
		if p.gen == nil && len(p.entries) == 0 {
			delete(c.parts, id)
		}
	}
	c.mu.Unlock()
	c.log.Info("kafka: joined consumer group generation", "group", c.q.cfg.Group,
		"generation", gen.ID, "partitions", ids)

	// Jobs settled before the rebalance whose commit failed are committed
	// now, if this member still owns their partition.
	cctx, cancel := context.WithTimeout(ctx, c.q.cfg.Timeout)
	if err := c.commit(cctx); err != nil {
		c.logCommitError(err)
	}
	cancel()

	for _, a := range assigned {
		gen.Start(func(ctx context.Context) { c.readPartition(ctx, gen, a.ID, a.Offset) })
	}
}

// readPartition fetches one partition for the life of gen and queues each
// message not already known. It returns only when gen ends: a function
// started on a generation that returns ends the generation.
func (c *Consumer) readPartition(ctx context.Context, gen *kafkago.Generation, id int, offset int64) {
	cfg := c.q.cfg
	r := kafkago.NewReader(kafkago.ReaderConfig{
		Brokers:        cfg.Brokers,
		Topic:          cfg.Topic,
		Partition:      id,
		Dialer:         c.q.dialer(c.name),
		MinBytes:       1,
		MaxBytes:       max(10<<20, cfg.TopicMaxMessageBytes()),
		MaxWait:        fetchMaxWait,
		ReadBackoffMin: 50 * time.Millisecond,
		ReadBackoffMax: time.Second,
		ErrorLogger:    kafkaLogger(c.log, slog.LevelDebug),
	})
	defer r.Close()
	if offset < 0 {
		offset = kafkago.FirstOffset
	}
	if err := r.SetOffset(offset); err != nil {
		c.log.Error("kafka: set reader offset", "partition", id, "offset", offset, "err", err)
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("kafka: fetch failed; retrying", "topic", cfg.Topic, "partition", id, "err", err)
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		e := c.track(gen, id, m)
		if e == nil {
			continue
		}
		select {
		case c.ready <- e:
		case <-ctx.Done():
			c.mu.Lock()
			if e.state == stateQueued {
				e.state = stateDropped
				delete(e.part.entries, e.offset)
			}
			c.mu.Unlock()
			return
		}
	}
}

// track records a message fetched in gen and returns its entry, or nil if
// the message is already committed or known (fetched again after a
// rebalance while running, waiting or settled here), or gen is over.
func (c *Consumer) track(gen *kafkago.Generation, id int, m kafkago.Message) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.parts[id]
	if p == nil || p.gen != gen || m.Offset < p.committed {
		return nil
	}
	if _, known := p.entries[m.Offset]; known {
		return nil
	}
	e := &entry{part: p, offset: m.Offset, requestID: string(m.Key), body: m.Value, state: stateQueued}
	e.trace, e.traceDropped = telemetry.TraceFromKafkaHeaders(m.Headers)
	p.entries[m.Offset] = e
	return e
}

// Fetch returns up to max deliveries, blocking until there is one, ctx
// ends (ctx.Err()) or the Consumer is closed (ErrClosed). A message is
// delivered once Claims granted this member its claim: Attempt 1 for a new
// job, more for a job taken over from a member whose claim expired. A job
// whose claim another member holds waits here, re-checked every
// ClaimTTL/10 (20ms to 1s), until that member settles it (it is skipped)
// or its claim expires (it is taken over). When Claims fails and nothing
// could be delivered, Fetch returns the error; the affected messages are
// tried again by a later Fetch.
func (c *Consumer) Fetch(ctx context.Context, max int) ([]failover.Delivery, error) {
	if max < 1 {
		return nil, fmt.Errorf("kafka: fetch: max %d < 1", max)
	}
	if err := c.join(); err != nil {
		return nil, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		select {
		case <-c.closing:
			return nil, ErrClosed
		default:
		}
		batch, next := c.takeDue(time.Now(), max)
		batch = c.takeReady(batch, max)
		if len(batch) == 0 {
			e, err := c.awaitReady(ctx, next)
			if err != nil {
				return nil, err
			}
			if e == nil {
				continue // a waiting entry may be due
			}
			if c.accept(e) {
				batch = append(batch, e)
			}
			batch = c.takeReady(batch, max)
		}
		ds, err := c.claim(ctx, batch)
		if len(ds) > 0 {
			return ds, nil
		}
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return nil, ctxErr
			}
			return nil, err
		}
	}
}

// awaitReady blocks until a fetched message arrives (returned), a waiting
// entry falls due at next or is added (nil, nil), ctx ends or the Consumer
// closes.
func (c *Consumer) awaitReady(ctx context.Context, next time.Time) (*entry, error) {
	var due <-chan time.Time
	if !next.IsZero() {
		t := time.NewTimer(time.Until(next))
		defer t.Stop()
		due = t.C
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closing:
		return nil, ErrClosed
	case <-c.wake:
		return nil, nil
	case <-due:
		return nil, nil
	case e := <-c.ready:
		return e, nil
	}
}

// takeDue takes up to max waiting entries whose retry is due, and returns
// when the next one falls due (zero if none waits).
func (c *Consumer) takeDue(now time.Time, max int) ([]*entry, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var batch []*entry
	var next time.Time
	for e := range c.waiting {
		if len(batch) < max && !e.retryAt.After(now) {
			delete(c.waiting, e)
			e.state = stateClaiming
			batch = append(batch, e)
			continue
		}
		if next.IsZero() || e.retryAt.Before(next) {
			next = e.retryAt
		}
	}
	return batch, next
}

// takeReady adds fetched messages to batch without blocking, up to max.
func (c *Consumer) takeReady(batch []*entry, max int) []*entry {
	for len(batch) < max {
		select {
		case e := <-c.ready:
			if c.accept(e) {
				batch = append(batch, e)
			}
		default:
			return batch
		}
	}
	return batch
}

// accept moves a message taken from the ready channel to claiming, unless
// a rebalance dropped it meanwhile.
func (c *Consumer) accept(e *entry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.state != stateQueued {
		return false
	}
	e.state = stateClaiming
	return true
}

// retryInterval is how often a job claimed by another member is checked.
func (c *Consumer) retryInterval() time.Duration {
	return min(max(c.q.cfg.ClaimTTL/10, 20*time.Millisecond), time.Second)
}

// claim asks Claims for each entry of batch (all claiming) and returns the
// deliveries granted; the others end up done or waiting.
func (c *Consumer) claim(ctx context.Context, batch []*entry) ([]failover.Delivery, error) {
	claims := c.q.cfg.Claims
	var (
		ds       []failover.Delivery
		firstErr error
		finished bool
	)
	for i, e := range batch {
		if ctx.Err() != nil {
			// Give the rest back at once, for the next Fetch.
			c.mu.Lock()
			for _, rest := range batch[i:] {
				c.wait(rest, time.Now())
			}
			c.mu.Unlock()
			break
		}
		attempt, err := 1, error(nil)
		if claims != nil {
			attempt, err = claims.Claim(ctx, c.claimID(e), c.member, c.q.cfg.ClaimTTL)
		}
		c.mu.Lock()
		switch {
		case err == nil:
			if e.bump && attempt <= e.attempt {
				attempt = e.attempt + 1
			}
			e.bump = false
			e.state = stateInflight
			e.attempt = attempt
			ds = append(ds, failover.Delivery{ID: deliveryID(e.part.id, e.offset), Body: e.body, Attempt: attempt,
				Trace: e.trace, TraceDropped: e.traceDropped})
		case errors.Is(err, ErrClaimDone):
			c.markDone(e)
			finished = true
		case errors.Is(err, ErrClaimHeld):
			c.wait(e, time.Now().Add(c.retryInterval()))
		default:
			c.wait(e, time.Now().Add(c.retryInterval()))
			if firstErr == nil {
				firstErr = fmt.Errorf("kafka: claim %s: %w", deliveryID(e.part.id, e.offset), err)
			}
		}
		c.mu.Unlock()
	}
	if finished {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.q.cfg.Timeout)
		if err := c.commit(cctx); err != nil {
			c.logCommitError(err)
		}
		cancel()
	}
	return ds, firstErr
}

// wait puts e on the waiting list, to be claimed again at retryAt. The
// caller holds c.mu.
func (c *Consumer) wait(e *entry, at time.Time) {
	e.state = stateWaiting
	e.retryAt = at
	c.waiting[e] = struct{}{}
}

// markDone records e as settled and forgets it when no commit needs it.
// The caller holds c.mu.
func (c *Consumer) markDone(e *entry) {
	delete(c.waiting, e)
	e.state = stateDone
	if p := e.part; p.gen == nil || e.offset < p.committed {
		delete(p.entries, e.offset)
	}
}

// claimID names e's job in Claims: group, topic, partition, offset and
// request id, so ids are never reused, not even by a re-created topic.
func (c *Consumer) claimID(e *entry) string {
	return c.q.cfg.Group + ":" + c.q.cfg.Topic + ":" + deliveryID(e.part.id, e.offset) + ":" + e.requestID
}

func deliveryID(partition int, offset int64) string {
	return strconv.Itoa(partition) + ":" + strconv.FormatInt(offset, 10)
}

func parseDeliveryID(id string) (int, int64, error) {
	ps, os, ok := strings.Cut(id, ":")
	p, perr := strconv.Atoi(ps)
	o, oerr := strconv.ParseInt(os, 10, 64)
	if !ok || perr != nil || oerr != nil || p < 0 || o < 0 {
		return 0, 0, fmt.Errorf("kafka: malformed delivery id %q, want partition:offset", id)
	}
	return p, o, nil
}

// outstanding returns the entry of d while it is delivered and unsettled
// here (running, or waiting after its claim was lost), else nil.
func (c *Consumer) outstanding(d failover.Delivery) (*entry, error) {
	pid, off, err := parseDeliveryID(d.ID)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.parts[pid]
	if p == nil {
		return nil, nil
	}
	e := p.entries[off]
	if e == nil || (e.state != stateInflight && e.state != stateWaiting) {
		return nil, nil
	}
	return e, nil
}

// Ack settles d: it records the job done in Claims, only if this member
// still holds its claim (one atomic step, like ack.lua on Redis Streams),
// then commits the partition up to its lowest unfinished job.
// Acknowledging a delivery no longer outstanding here does nothing.
//
// When another member took the job over (this worker stalled past
// ClaimTTL and its partition moved), Ack changes nothing and returns an
// error wrapping failover.ErrClaimLost: the job is its successor's to
// finish, and waits here like any job claimed by another member. Without
// Claims the generation is the owner check: a job whose partition this
// member no longer owns is forgotten here, not committed (its new owner
// delivers it again), and Ack returns ErrClaimLost too.
//
// With Claims a failed commit is retried by later commits and a re-fetch
// meanwhile skips the job, so Ack returns only the claim's error; without
// Claims a failed commit is returned, since the job may then be
// delivered again.
func (c *Consumer) Ack(ctx context.Context, d failover.Delivery) error {
	e, err := c.outstanding(d)
	if err != nil || e == nil {
		return err
	}
	return c.finish(ctx, e, "ack")
}

// finish releases e's claim if this member holds it, marks e done and
// commits; op names the caller in errors.
func (c *Consumer) finish(ctx context.Context, e *entry, op string) error {
	var releaseErr error
	if claims := c.q.cfg.Claims; claims != nil {
		err := claims.Release(ctx, c.claimID(e), c.member)
		switch {
		case errors.Is(err, failover.ErrClaimLost):
			c.lostClaim(e)
			return fmt.Errorf("kafka: %s %s: %w", op, deliveryID(e.part.id, e.offset), err)
		case err != nil:
			// Whether the job is marked done is unknown; the commit below
			// still settles it for Kafka, and a claim never released only
			// matters to a re-fetch, which the commit prevents.
			releaseErr = fmt.Errorf("kafka: %s %s: %w", op, deliveryID(e.part.id, e.offset), err)
		}
	}
	c.mu.Lock()
	owned := c.ownsLocked(e)
	c.markDone(e)
	c.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, c.q.cfg.Timeout)
	defer cancel()
	commitErr := c.commit(cctx)
	if c.q.cfg.Claims != nil {
		if commitErr != nil {
			c.logCommitError(commitErr)
		}
		return releaseErr
	}
	if !owned {
		return fmt.Errorf("kafka: %s %s: partition %d moved to another member: %w", op,
			deliveryID(e.part.id, e.offset), e.part.id, failover.ErrClaimLost)
	}
	return commitErr
}

// ownsLocked reports whether this member owns e's partition in its current
// generation. The caller holds c.mu.
func (c *Consumer) ownsLocked(e *entry) bool {
	return e.part.gen != nil && e.part.gen == c.gen
}

// lostClaim puts e, found claimed by another member, on the waiting list:
// while this member owns the partition, a later Fetch learns whether the
// successor finished it (skipped) or let it expire (taken over again).
func (c *Consumer) lostClaim(e *entry) {
	c.mu.Lock()
	if e.state == stateInflight {
		c.wait(e, time.Now().Add(c.retryInterval()))
	}
	c.mu.Unlock()
	c.wakeFetch()
}

// Touch extends this member's claim on d by ClaimTTL. It returns an error
// wrapping failover.ErrClaimLost when d is not outstanding here or another
// member took it over (or it was settled elsewhere); the job then waits
// here like any job claimed by another member. Without Claims it only
// checks that d is outstanding.
func (c *Consumer) Touch(ctx context.Context, d failover.Delivery) error {
	e, err := c.outstanding(d)
	if err != nil {
		return err
	}
	c.mu.Lock()
	running := e != nil && e.state == stateInflight
	c.mu.Unlock()
	if !running {
		return fmt.Errorf("kafka: touch %s: not running here: %w", d.ID, failover.ErrClaimLost)
	}
	claims := c.q.cfg.Claims
	if claims == nil {
		return nil
	}
	err = claims.Refresh(ctx, c.claimID(e), c.member, c.q.cfg.ClaimTTL)
	if err == nil {
		return nil
	}
	if errors.Is(err, failover.ErrClaimLost) {
		c.lostClaim(e)
	}
	return fmt.Errorf("kafka: touch %s: %w", d.ID, err)
}

func (c *Consumer) wakeFetch() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// maxReasonBytes bounds the reason header of a dead letter: reasons may
// carry provider error text, and the record must fit the topic's
// max.message.bytes beside a body of MaxMessageBytes.
const maxReasonBytes = 1024

// DeadLetter writes the job to Config.DeadLetterTopic (key: request id,
// value: the body with Config.KeepPayload, else empty; headers reason,
// attempt, source_topic, source_partition, source_offset, body_sha1,
// body_bytes, failed_at_ms) with the producer's acks, and only then
// settles it like Ack. A delivery no longer outstanding here is not
// written.
//
// Ownership is checked before the write and again, atomically with the
// done mark, after it (Ack's rule): with Claims, the claim is first
// extended by ClaimTTL plus WriteTimeout, so no other member can take the
// job over while its record is written, and a job another member holds
// already is not written at all (an error wrapping failover.ErrClaimLost).
// Without Claims a job whose partition moved to another member is not
// written either. When the write fails the job is not settled: it is
// delivered again, with a new attempt, after ClaimTTL.
func (c *Consumer) DeadLetter(ctx context.Context, d failover.Delivery, reason string) error {
	e, err := c.outstanding(d)
	if err != nil || e == nil {
		return err
	}
	if claims := c.q.cfg.Claims; claims != nil {
		if err := claims.Refresh(ctx, c.claimID(e), c.member, c.q.cfg.ClaimTTL+c.q.cfg.WriteTimeout); err != nil {
			if errors.Is(err, failover.ErrClaimLost) {
				c.lostClaim(e)
			}
			return fmt.Errorf("kafka: dead-letter %s: %w", d.ID, err)
		}
	} else {
		c.mu.Lock()
		owned := c.ownsLocked(e)
		c.mu.Unlock()
		if !owned {
			return fmt.Errorf("kafka: dead-letter %s: partition %d moved to another member: %w", d.ID, e.part.id, failover.ErrClaimLost)
		}
	}
	c.mu.Lock()
	attempt := e.attempt
	c.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, c.q.cfg.WriteTimeout)
	defer cancel()
	err = c.q.writer.WriteMessages(wctx, c.q.deadLetterMessage(e.requestID, e.body, reason, attempt, e.part.id, e.offset))
	if err != nil {
		c.mu.Lock()
		if e.state == stateInflight {
			e.bump = true
			c.wait(e, time.Now().Add(c.q.cfg.ClaimTTL))
		}
		c.mu.Unlock()
		c.wakeFetch()
		return fmt.Errorf("kafka: dead-letter %s to %s: %w", d.ID, c.q.cfg.DeadLetterTopic, err)
	}
	return c.finish(ctx, e, "dead-letter")
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// commitTargets returns, for each partition this member owns in gen, the
// offset to commit when it is above the committed one: the lowest
// unfinished entry, or one past the highest entry when all are done.
// The caller holds c.mu.
func (c *Consumer) commitTargets(gen *kafkago.Generation) []kafkago.OffsetCommit {
	var out []kafkago.OffsetCommit
	for _, p := range c.parts {
		if p.gen != gen {
			continue
		}
		lowestOpen, highest := int64(-1), int64(-1)
		for off, e := range p.entries {
			if off < p.committed {
				continue // settled elsewhere; not this member's to hold back
			}
			highest = max(highest, off)
			if e.state != stateDone && (lowestOpen < 0 || off < lowestOpen) {
				lowestOpen = off
			}
		}
		target := highest + 1
		if lowestOpen >= 0 {
			target = lowestOpen
		}
		if highest >= 0 && target > p.committed {
			out = append(out, kafkago.OffsetCommit{Partition: p.id, Offset: target})
		}
	}
	return out
}

// commit commits every owned partition up to its lowest unfinished job.
// Commits run one at a time and each recomputes its targets, so
// concurrent Acks coalesce and a commit never moves an offset back. The
// broker refuses a commit from a generation that ended, so a partition
// that moved on is never committed by its former owner.
func (c *Consumer) commit(ctx context.Context) error {
	select {
	case c.commitSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.commitSem }()
	c.mu.Lock()
	gen := c.gen
	var targets []kafkago.OffsetCommit
	if gen != nil {
		targets = c.commitTargets(gen)
	}
	c.mu.Unlock()
	if len(targets) == 0 {
		return nil
	}
	res, err := c.q.client.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{
		GroupID:      c.q.cfg.Group,
		GenerationID: int(gen.ID),
		MemberID:     gen.MemberID,
		Topics:       map[string][]kafkago.OffsetCommit{c.q.cfg.Topic: targets},
	})
	if err != nil {
		return fmt.Errorf("kafka: commit %s generation %d: %w", c.q.cfg.Group, gen.ID, err)
	}
	var errs []error
	failed := make(map[int]bool)
	for _, p := range res.Topics[c.q.cfg.Topic] {
		if p.Error != nil {
			failed[p.Partition] = true
			errs = append(errs, fmt.Errorf("kafka: commit %s partition %d: %w", c.q.cfg.Group, p.Partition, p.Error))
		}
	}
	c.mu.Lock()
	for _, t := range targets {
		p := c.parts[t.Partition]
		if failed[t.Partition] || p == nil || p.gen != gen || t.Offset <= p.committed {
			continue
		}
		p.committed = t.Offset
		for off, e := range p.entries {
			if off < p.committed && e.state == stateDone {
				delete(p.entries, off)
			}
		}
	}
	c.mu.Unlock()
	return errors.Join(errs...)
}

// logCommitError logs a failed commit; a rebalance makes commits of the
// old generation fail routinely, and the next generation commits again.
func (c *Consumer) logCommitError(err error) {
	if errors.Is(err, kafkago.RebalanceInProgress) || errors.Is(err, kafkago.IllegalGeneration) ||
		errors.Is(err, kafkago.UnknownMemberId) || errors.Is(err, context.Canceled) {
		c.log.Debug("kafka: offset commit refused during a rebalance; the next generation commits", "err", err)
		return
	}
	c.log.Warn("kafka: offset commit failed; a later commit retries", "err", err)
}
