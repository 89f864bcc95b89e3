package admission

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// serviceWeight is the weight of the newest stream duration in the
// service-time EWMA: the last ten or so streams dominate.
const serviceWeight = 0.1

// ServiceTime estimates how long a request waits for a slot from an EWMA
// of observed stream durations. It backs the Retry-After of pool and queue
// refusals. It is safe for concurrent use.
type ServiceTime struct {
	max time.Duration

	mu       sync.Mutex // serialises Observe
	observed bool
	mean     atomic.Int64 // nanoseconds
}

// NewServiceTime returns an estimator that assumes a stream takes initial
// until the first Observe, and advises at most maxWait (at least 1s).
func NewServiceTime(initial, maxWait time.Duration) (*ServiceTime, error) {
	if initial <= 0 || maxWait < time.Second {
		return nil, errors.New("admission: service time needs a positive initial duration and a max of at least 1s")
	}
	s := &ServiceTime{max: maxWait}
	s.mean.Store(int64(initial))
	return s, nil
}

// Observe records the duration of one finished stream (slot acquired to
// released). Durations not above zero are ignored. The first observation
// replaces the initial guess.
func (s *ServiceTime) Observe(d time.Duration) {
	if d <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.observed {
		s.observed = true
		s.mean.Store(int64(d))
		return
	}
	m := float64(s.mean.Load())
	s.mean.Store(int64(m + serviceWeight*(float64(d)-m)))
}

// Mean returns the current estimate of one stream's duration.
func (s *ServiceTime) Mean() time.Duration { return time.Duration(s.mean.Load()) }

// RetryAfter estimates how long a request with queueAhead requests before
// it waits when slots streams run at once: (queueAhead+1)/slots × the mean
// service time — the request itself needs a slot too, so with nothing ahead
// it still waits for one of the slots to free. The result is clamped to
// [1s, the maximum given to NewServiceTime]. Clients should add about ±20% jitter so refused callers do not
// come back together.
func (s *ServiceTime) RetryAfter(queueAhead, slots int) time.Duration {
	queueAhead = max(queueAhead, 0)
	slots = max(slots, 1)
	d := float64(queueAhead+1) / float64(slots) * float64(s.mean.Load())
	return min(max(time.Duration(math.Min(d, float64(s.max))), time.Second), s.max)
}
