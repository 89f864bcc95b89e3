package stream

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Queued position (docs/API.md, "queued"): while a request waits for a
// worker, the session sends `event: queued` when it starts waiting and
// whenever the position changed by 10 % or more, at most once a second.

const (
	// positionEvery is the most often a position is sent, and how often it
	// is checked.
	positionEvery = time.Second
	// positionChange is the relative change that is worth an event.
	positionChange = 0.10
	// progressTimeout bounds one progress query.
	progressTimeout = 500 * time.Millisecond
	// rateWeight is the weight of the newest sample in the drain-rate EWMA.
	rateWeight = 0.3
)

// progress shares the queue's progress counters among every waiting
// request of the process: queries are shared, never made one per request,
// and an EWMA of the rate at which jobs are handed to workers gives the
// ETA. Safe for concurrent use.
//
// A fresh read (right after an enqueue) needs a query that started after
// the call, so that it counts the job just enqueued; every fresh read
// arriving while one query runs shares the single query that starts when
// that one ends. A read that need not be fresh takes counters at most half
// a positionEvery old, or joins the query in flight. So at most one query
// runs and one waits, whatever the number of requests: under a burst the
// queue is asked once a round trip, not once a request (docs/bench-history/2026-11.md,
// "The queued path's CPU"), and no request waits behind others' queries.
type progress struct {
	q failover.Positioner

	mu      sync.Mutex
	at      time.Time // when handed and waiting were read
	handed  int64
	waiting int64
	rate    float64 // jobs handed per second; 0 until observed
	// cur is the query in flight, next the one that starts when cur
	// ended, for the fresh reads that arrived meanwhile.
	cur, next *progressQuery
}

// progressQuery is one shared Progress query: done closes once its
// result is set.
type progressQuery struct {
	done            chan struct{}
	handed, waiting int64
	ok              bool
}

// read returns the counters, from a query that started after the call
// when fresh is set (right after an enqueue), else at most half a
// positionEvery old.
func (p *progress) read(fresh bool) (handed, waiting int64, ok bool) {
	p.mu.Lock()
	if !fresh && !p.at.IsZero() && time.Since(p.at) < positionEvery/2 {
		defer p.mu.Unlock()
		return p.handed, p.waiting, true
	}
	var q *progressQuery
	switch {
	case !fresh && p.cur != nil:
		q = p.cur
	case p.next != nil:
		q = p.next // not started yet: fresh for this caller too
	case p.cur != nil:
		// The query in flight may have started before the caller's
		// enqueue: the caller leads the next one, once it ended.
		q = &progressQuery{done: make(chan struct{})}
		p.next = q
		prev := p.cur
		p.mu.Unlock()
		<-prev.done
		p.mu.Lock()
		p.cur, p.next = q, nil
		p.mu.Unlock()
		p.query(q)
		return q.handed, q.waiting, q.ok
	default:
		q = &progressQuery{done: make(chan struct{})}
		p.cur = q
		p.mu.Unlock()
		p.query(q)
		return q.handed, q.waiting, q.ok
	}
	p.mu.Unlock()
	<-q.done
	return q.handed, q.waiting, q.ok
}

// query runs q, which the caller made p.cur, and publishes its result.
func (p *progress) query(q *progressQuery) {
	ctx, cancel := context.WithTimeout(context.Background(), progressTimeout)
	h, w, err := p.q.Progress(ctx)
	cancel()
	now := time.Now()
	p.mu.Lock()
	if err == nil {
		if !p.at.IsZero() && h >= p.handed {
			if dt := now.Sub(p.at).Seconds(); dt > 0.1 {
				sample := float64(h-p.handed) / dt
				if p.rate == 0 {
					p.rate = sample
				} else {
					p.rate = rateWeight*sample + (1-rateWeight)*p.rate
				}
			}
		}
		p.at, p.handed, p.waiting = now, h, w
		q.handed, q.waiting, q.ok = h, w, true
	}
	p.cur = nil
	p.mu.Unlock()
	close(q.done)
}

// eta is the expected wait, in whole seconds, for a job with ahead jobs
// before it; false while no drain was observed.
func (p *progress) eta(ahead int64) (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate <= 0 {
		return 0, false
	}
	return int64(math.Ceil(float64(ahead+1) / p.rate)), true
}

// position follows one waiting request.
type position struct {
	p       *progress
	handed0 int64 // the counter when the job was enqueued
	ahead0  int64 // jobs waiting ahead of it then
	sent    int64 // the position last sent; -1 before the first
	sentAt  time.Time
}

// newPosition starts following a job just enqueued; nil when the queue
// cannot tell.
func (h *Handler) newPosition() *position {
	if h.progress == nil {
		return nil
	}
	handed, waiting, ok := h.progress.read(true)
	if !ok {
		return nil
	}
	return &position{p: h.progress, handed0: handed, ahead0: max(0, waiting-1), sent: -1}
}

// next returns the queued event to send now, if any.
func (ps *position) next(now time.Time) (*protocol.Queued, bool) {
	if ps.sent >= 0 && now.Sub(ps.sentAt) < positionEvery {
		return nil, false
	}
	handed, _, ok := ps.p.read(false)
	if !ok {
		return nil, false
	}
	ahead := max(0, ps.ahead0-(handed-ps.handed0))
	if ps.sent >= 0 && !changedEnough(ps.sent, ahead) {
		return nil, false
	}
	ps.sent, ps.sentAt = ahead, now
	q := &protocol.Queued{Position: ahead}
	if eta, ok := ps.p.eta(ahead); ok {
		q.EtaSeconds = &eta
	}
	return q, true
}

// changedEnough reports a change of positionChange or more (any change
// from or to 0).
func changedEnough(was, now int64) bool {
	if was == now {
		return false
	}
	if was == 0 {
		return true
	}
	d := float64(was - now)
	return math.Abs(d)/float64(was) >= positionChange || now == 0
}
