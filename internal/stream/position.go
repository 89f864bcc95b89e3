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
// request of the process: at most one query per positionEvery/2 whatever
// the number of waiting requests, and an EWMA of the rate at which jobs
// are handed to workers, for the ETA. Safe for concurrent use.
type progress struct {
	q failover.Positioner

	mu      sync.Mutex
	at      time.Time // when handed and waiting were read
	handed  int64
	waiting int64
	rate    float64 // jobs handed per second; 0 until observed
}

// read returns the counters, fresh when fresh is set (right after an
// enqueue), else at most half a positionEvery old.
func (p *progress) read(fresh bool) (handed, waiting int64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if fresh || p.at.IsZero() || now.Sub(p.at) >= positionEvery/2 {
		ctx, cancel := context.WithTimeout(context.Background(), progressTimeout)
		h, w, err := p.q.Progress(ctx)
		cancel()
		if err != nil {
			return 0, 0, false
		}
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
	}
	return p.handed, p.waiting, true
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
