// Package memqueue owns the in-memory failover queue: the same semantics as
// the Redis Streams backend (redelivery after ReclaimIdle unless touched,
// attempt counting, dead letters, depth = unacknowledged jobs) in one
// process, for fast unit tests of the api and the worker. It starts no
// goroutines and waits only on channels and timers, so it also runs inside
// a testing/synctest bubble.
package memqueue

import (
	"cmp"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
)

// ErrClaimLost is returned by Touch when the delivery is no longer held by
// the touching consumer: it was acknowledged, dead-lettered, or taken over
// by another consumer after ReclaimIdle. The worker should stop the job.
var ErrClaimLost = failover.ErrClaimLost

// Config configures a Queue.
type Config struct {
	// ReclaimIdle is how long a delivered, unacknowledged job may go
	// without Touch before another consumer's Fetch takes it over
	// (QUEUE_RECLAIM_IDLE_SECONDS). Default failover.DefaultReclaimIdle.
	ReclaimIdle time.Duration
}

// Validate reports whether cfg is usable; zero values mean the defaults.
func (cfg Config) Validate() error {
	if cfg.ReclaimIdle < 0 {
		return fmt.Errorf("memqueue: ReclaimIdle %s is negative", cfg.ReclaimIdle)
	}
	return nil
}

type entry struct {
	seq       uint64
	requestID string
	body      []byte
	// Set once delivered: who holds it, how often it was delivered, and
	// when its idle time last restarted (delivery or Touch).
	owner      string
	deliveries int
	lastSeen   time.Time
}

// Queue is an in-memory failover queue shared by one Producer side and any
// number of Consumers. Safe for concurrent use; it holds no resources, so
// it needs no Close.
type Queue struct {
	reclaimIdle time.Duration

	mu      sync.Mutex
	seq     uint64
	ready   []*entry          // never delivered, FIFO
	pending map[uint64]*entry // delivered, not yet acknowledged
	dead    []failover.DeadLetter
	// changed is closed and replaced whenever a job becomes available, so
	// blocked Fetch calls wake without polling.
	changed chan struct{}
}

var (
	_ failover.Producer   = (*Queue)(nil)
	_ failover.Depther    = (*Queue)(nil)
	_ failover.Positioner = (*Queue)(nil)
	_ failover.Consumer   = (*Consumer)(nil)
	_ failover.Reclaimer  = (*Consumer)(nil)
)

// New returns an empty Queue.
func New(cfg Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	idle := cfg.ReclaimIdle
	if idle == 0 {
		idle = failover.DefaultReclaimIdle
	}
	return &Queue{
		reclaimIdle: idle,
		pending:     make(map[uint64]*entry),
		changed:     make(chan struct{}),
	}, nil
}

// Enqueue appends a job; the queue keeps its own copy of body.
func (q *Queue) Enqueue(ctx context.Context, requestID string, body []byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memqueue: enqueue: %w: %w", failover.ErrQueueUnavailable, err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	q.ready = append(q.ready, &entry{seq: q.seq, requestID: requestID, body: slices.Clone(body)})
	q.wakeLocked()
	return nil
}

// Progress returns the jobs ever delivered and those never delivered yet;
// exact.
func (q *Queue) Progress(ctx context.Context) (handed, waiting int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return int64(q.seq) - int64(len(q.ready)), int64(len(q.ready)), nil
}

// Depth returns the number of jobs enqueued and not yet acknowledged or
// dead-lettered.
func (q *Queue) Depth(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return int64(len(q.ready) + len(q.pending)), nil
}

// DeadLetterDepth returns the number of dead-lettered jobs.
func (q *Queue) DeadLetterDepth(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return int64(len(q.dead)), nil
}

// DeadLetters returns up to count dead-lettered jobs, oldest first.
func (q *Queue) DeadLetters(ctx context.Context, count int) ([]failover.DeadLetter, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if count < 1 {
		return nil, fmt.Errorf("memqueue: dead letters: count %d < 1", count)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]failover.DeadLetter, 0, min(count, len(q.dead)))
	for _, d := range q.dead[:min(count, len(q.dead))] {
		d.Body = slices.Clone(d.Body)
		out = append(out, d)
	}
	return out, nil
}

// Consumer returns the consumer-group member called name. Members with the
// same name share their claims, as in a Redis consumer group.
func (q *Queue) Consumer(name string) *Consumer {
	return &Consumer{q: q, name: name}
}

func (q *Queue) wakeLocked() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// Consumer is one member of the Queue's consumer group. Safe for
// concurrent use.
type Consumer struct {
	q    *Queue
	name string
	// reclaimer is set, under q.mu, by the first Reclaim call: from then
	// on only Reclaim takes idle jobs over, not Fetch.
	reclaimer bool
}

// Fetch returns up to max deliveries: jobs idle for ReclaimIdle (taken
// over, Attempt grown by one) first, then new jobs (Attempt 1). It blocks
// until one is available or ctx ends. Once Reclaim has been called, Fetch
// returns new jobs only.
func (c *Consumer) Fetch(ctx context.Context, max int) ([]failover.Delivery, error) {
	if max < 1 {
		return nil, fmt.Errorf("memqueue: fetch: max %d < 1", max)
	}
	q := c.q
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		q.mu.Lock()
		now := time.Now()
		ds, nextIdle := c.takeLocked(now, max)
		changed := q.changed
		q.mu.Unlock()
		if len(ds) > 0 {
			return ds, nil
		}
		// Sleep until a job is enqueued, or until the earliest pending job
		// could have gone idle (a Touch meanwhile just means another round).
		var expired <-chan time.Time
		if !nextIdle.IsZero() {
			if timer == nil {
				timer = time.NewTimer(nextIdle.Sub(now))
			} else {
				timer.Reset(nextIdle.Sub(now))
			}
			expired = timer.C
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		case <-expired:
		}
	}
}

// Reclaim takes over, without blocking, up to max jobs idle for
// ReclaimIdle, oldest first (failover.Reclaimer).
func (c *Consumer) Reclaim(ctx context.Context, max int) ([]failover.Delivery, error) {
	if max < 1 {
		return nil, fmt.Errorf("memqueue: reclaim: max %d < 1", max)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	c.reclaimer = true
	now := time.Now()
	var idle []*entry
	for _, e := range q.pending {
		if !now.Before(e.lastSeen.Add(q.reclaimIdle)) {
			idle = append(idle, e)
		}
	}
	slices.SortFunc(idle, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	var ds []failover.Delivery
	for _, e := range idle[:min(max, len(idle))] {
		ds = append(ds, c.deliverLocked(e, now))
	}
	return ds, nil
}

// ReclaimInterval is how often Reclaim should run: a third of
// ReclaimIdle, between 50ms and 1s, as the Redis queue's.
func (c *Consumer) ReclaimInterval() time.Duration {
	return min(max(c.q.reclaimIdle/3, 50*time.Millisecond), time.Second)
}

// takeLocked claims up to max jobs for c. When it finds none it returns
// the earliest time a pending job may become idle (zero if none is
// pending).
func (c *Consumer) takeLocked(now time.Time, max int) ([]failover.Delivery, time.Time) {
	q := c.q
	var idle []*entry
	var nextIdle time.Time
	for _, e := range q.pending {
		if c.reclaimer {
			break
		}
		at := e.lastSeen.Add(q.reclaimIdle)
		if !now.Before(at) {
			idle = append(idle, e)
		} else if nextIdle.IsZero() || at.Before(nextIdle) {
			nextIdle = at
		}
	}
	slices.SortFunc(idle, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	var ds []failover.Delivery
	for _, e := range idle[:min(max, len(idle))] {
		ds = append(ds, c.deliverLocked(e, now))
	}
	if len(ds) > 0 {
		return ds, time.Time{}
	}
	n := min(max, len(q.ready))
	for _, e := range q.ready[:n] {
		q.pending[e.seq] = e
		ds = append(ds, c.deliverLocked(e, now))
	}
	q.ready = slices.Delete(q.ready, 0, n)
	return ds, nextIdle
}

func (c *Consumer) deliverLocked(e *entry, now time.Time) failover.Delivery {
	e.owner = c.name
	e.deliveries++
	e.lastSeen = now
	return failover.Delivery{ID: strconv.FormatUint(e.seq, 10), Body: slices.Clone(e.body), Attempt: e.deliveries}
}

// pendingLocked returns the pending entry behind d, or nil.
func (q *Queue) pendingLocked(d failover.Delivery) *entry {
	seq, err := strconv.ParseUint(d.ID, 10, 64)
	if err != nil {
		return nil
	}
	return q.pending[seq]
}

// Ack removes the job from the queue. Acknowledging a job that is no
// longer pending (already acknowledged or dead-lettered) does nothing; a
// job another member took over is left to it (ErrClaimLost), as on Redis.
func (c *Consumer) Ack(ctx context.Context, d failover.Delivery) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.pendingLocked(d)
	switch {
	case e == nil:
	case e.owner != c.name:
		return fmt.Errorf("memqueue: ack %s: held by %s: %w", d.ID, e.owner, ErrClaimLost)
	default:
		delete(q.pending, e.seq)
	}
	return nil
}

// Touch restarts the job's idle time without counting a new attempt. It
// returns ErrClaimLost when c no longer holds the job.
func (c *Consumer) Touch(ctx context.Context, d failover.Delivery) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.pendingLocked(d)
	if e == nil || e.owner != c.name {
		return fmt.Errorf("memqueue: touch %s: %w", d.ID, ErrClaimLost)
	}
	e.lastSeen = time.Now()
	return nil
}

// DeadLetter moves the job to the dead-letter list with reason and the
// delivery's attempt. A job that is no longer pending is not recorded
// again; a job another member took over is not recorded (ErrClaimLost).
func (c *Consumer) DeadLetter(ctx context.Context, d failover.Delivery, reason string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.pendingLocked(d)
	if e == nil {
		return nil
	}
	if e.owner != c.name {
		return fmt.Errorf("memqueue: dead-letter %s: held by %s: %w", d.ID, e.owner, ErrClaimLost)
	}
	delete(q.pending, e.seq)
	sum := sha1.Sum(e.body)
	q.dead = append(q.dead, failover.DeadLetter{
		ID:        strconv.Itoa(len(q.dead) + 1),
		RequestID: e.requestID,
		Body:      e.body,
		BodySHA1:  hex.EncodeToString(sum[:]),
		BodyBytes: len(e.body),
		Reason:    reason,
		Attempt:   d.Attempt,
		Source:    "memqueue delivery " + d.ID,
		FailedAt:  time.Now(),
	})
	return nil
}
