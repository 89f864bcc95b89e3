package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// deferRecheck is how long an identity found at its per-user limit is
// passed over before its parked jobs try again. Releases of its slots by
// this worker end the wait at once; the recheck covers slots released
// elsewhere (the api's direct streams, other consumers).
const deferRecheck = 200 * time.Millisecond

// waitSlot waits for a pool slot for job: until the job's deadline on
// first delivery, for QueueTimeout more when the job was taken over (its
// client has been waiting already, and was told so by a reset). The job
// waits in the scheduler, parked, holding no worker slot until its turn,
// and then in the pool at its place in line (docs/QUEUE.md, "Priority
// order"), so a high job that reached the pool after a normal one still
// gets the next slot.
func (w *Worker) waitSlot(ctx context.Context, job protocol.Job, d failover.Delivery) (pool.Lease, error) {
	deadline := job.Deadline
	if d.Attempt > 1 {
		deadline = time.Now().Add(w.cfg.QueueTimeout)
	}
	slotCtx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return w.sched.acquire(slotCtx, job.UserID, protocol.PlaceInLine(job.EnqueueTime, job.Priority, w.cfg.PriorityAging), d.Attempt > 1)
}

// scheduler decides which fetched job gets a worker slot next
// (docs/QUEUE.md, "Fairness"). Jobs wait parked in one FIFO per identity;
// a free worker slot goes to the next identity in round-robin order that
// has a parked job and is not known to be at its per-user limit, and to
// that identity's oldest job. The job then asks the pool, holding the
// worker slot, only for a global slot (pool.Deferrer): if its identity
// has no room it goes back to the front of its FIFO, the worker slot is
// given to another identity, and the identity is passed over until one of
// its slots is released here or deferRecheck passed. So a job that cannot
// start never holds a worker slot, and slots go round-robin between
// identities with work waiting, FIFO within one. Jobs taken over from a
// dead worker go before all of them, oldest takeover first: their clients
// have waited longest, and are told so (docs/QUEUE.md, "Takeover").
//
// Safe for concurrent use by the job goroutines; it starts no goroutine
// except the recheck timer, which stop ends.
type scheduler struct {
	pool      pool.Pool
	limit     int // worker slots: jobs holding one or asking the pool
	maxParked int

	// changed is signalled (cap 1) whenever room may have grown.
	changed chan struct{}

	mu      sync.Mutex
	inHand  int // fetched jobs not finished
	busy    int
	queues  map[string][]*ticket // parked jobs per identity, oldest first
	urgent  []*ticket            // parked takeovers, served first, oldest first
	ring    []string             // identities with parked jobs, in turn order
	next    int                  // index in ring of the next turn
	blocked map[string]bool      // identity.Bucket at the per-user limit: its users passed over
	timer   *time.Timer          // recheck of blocked identities
	stopped bool
}

// ticket is one parked job.
type ticket struct {
	user     string
	takeover bool          // a job taken over from a dead worker: urgent
	turn     chan struct{} // buffered 1: its turn came, a worker slot is its
}

func newScheduler(p pool.Pool, limit, maxParked int) *scheduler {
	return &scheduler{pool: p, limit: limit, maxParked: maxParked, changed: make(chan struct{}, 1),
		queues: make(map[string][]*ticket), blocked: make(map[string]bool)}
}

// room returns how many jobs the fetch loop may fetch now: as many as
// could start at once, counting the jobs in hand except those parked
// behind their identity's per-user limit, and no more than keeps the
// parked jobs within maxParked. Jobs are not fetched only to wait for a
// worker slot here while another consumer may have one free.
func (s *scheduler) room() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for user, q := range s.queues {
		if s.blocked[identity.Bucket(user)] {
			held += len(q)
		}
	}
	for _, t := range s.urgent {
		if s.blocked[identity.Bucket(t.user)] {
			held++
		}
	}
	return max(0, min(s.limit-(s.inHand-held), s.limit+s.maxParked-s.inHand))
}

// takeoverRoom returns how many jobs the takeover loop may take over now:
// as many as the scheduler holds at most (running and parked), less the
// takeovers parked already. Orphans are taken whatever room the fetch
// loop has, so that they wait here, heartbeating, instead of idle in the
// queue past their client's patience.
func (s *scheduler) takeoverRoom() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(0, s.limit+s.maxParked-len(s.urgent))
}

// took counts n fetched jobs in hand; finished counts one out.
func (s *scheduler) took(n int) {
	s.mu.Lock()
	s.inHand += n
	s.mu.Unlock()
}

func (s *scheduler) finished() {
	s.mu.Lock()
	s.inHand--
	s.mu.Unlock()
	s.signal()
}

// signal tells the fetch loop that room may have grown.
func (s *scheduler) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// acquire parks a job of user, waits for its turn, and returns a lease
// that also holds the job's worker slot until released; a takeover's turn
// comes before every other job's. It returns ctx's error when ctx ends
// first.
func (s *scheduler) acquire(ctx context.Context, user string, since time.Time, takeover bool) (pool.Lease, error) {
	t := &ticket{user: user, takeover: takeover, turn: make(chan struct{}, 1)}
	s.mu.Lock()
	s.parkLocked(t, false)
	s.dispatchLocked()
	s.mu.Unlock()
	for {
		select {
		case <-t.turn:
		case <-ctx.Done():
			s.mu.Lock()
			select {
			case <-t.turn: // its turn came as it gave up: pass the slot on
				s.busy--
			default:
				s.unparkLocked(t)
			}
			s.dispatchLocked()
			s.mu.Unlock()
			return nil, ctx.Err()
		}
		l, err := s.ask(ctx, user, since)
		s.mu.Lock()
		switch {
		case err == nil:
			s.mu.Unlock()
			return &slotLease{s: s, user: user, lease: l}, nil
		case errors.Is(err, pool.ErrUserLimit) && ctx.Err() == nil:
			// Cannot start: back to the front of its line, worker slot to
			// another identity.
			s.busy--
			s.blockLocked(user)
			s.parkLocked(t, true)
			s.dispatchLocked()
			s.mu.Unlock()
		default:
			s.busy--
			s.dispatchLocked()
			s.mu.Unlock()
			if errors.Is(err, pool.ErrUserLimit) {
				// Turned away just as its deadline passed: what ended the
				// wait is the deadline, not the limit.
				return nil, ctx.Err()
			}
			return nil, err
		}
	}
}

// ask asks the pool for a slot for user, turned away at once when user is
// at its limit if the pool can do that.
func (s *scheduler) ask(ctx context.Context, user string, since time.Time) (pool.Lease, error) {
	switch p := s.pool.(type) {
	case pool.Deferrer:
		return p.AcquireOrDefer(ctx, user, since)
	case pool.Queued:
		return p.AcquireSince(ctx, user, since)
	default:
		return s.pool.Acquire(ctx, user)
	}
}

// parkLocked puts t in its identity's line, at the front when it had its
// turn already.
func (s *scheduler) parkLocked(t *ticket, front bool) {
	if t.takeover {
		if front {
			s.urgent = slices.Insert(s.urgent, 0, t)
		} else {
			s.urgent = append(s.urgent, t)
		}
		return
	}
	q := s.queues[t.user]
	if len(q) == 0 && !slices.Contains(s.ring, t.user) {
		s.ring = append(s.ring, t.user)
	}
	if front {
		q = slices.Insert(q, 0, t)
	} else {
		q = append(q, t)
	}
	s.queues[t.user] = q
}

// unparkLocked takes t out of its line.
func (s *scheduler) unparkLocked(t *ticket) {
	if t.takeover {
		s.urgent = slices.DeleteFunc(s.urgent, func(x *ticket) bool { return x == t })
		return
	}
	q := slices.DeleteFunc(s.queues[t.user], func(x *ticket) bool { return x == t })
	if len(q) == 0 {
		delete(s.queues, t.user)
		s.dropLocked(t.user)
		return
	}
	s.queues[t.user] = q
}

// dropLocked takes user out of the ring, keeping the turn order of the rest.
func (s *scheduler) dropLocked(user string) {
	i := slices.Index(s.ring, user)
	if i < 0 {
		return
	}
	s.ring = slices.Delete(s.ring, i, i+1)
	if i < s.next {
		s.next--
	}
	if s.next >= len(s.ring) {
		s.next = 0
	}
}

// dispatchLocked gives free worker slots to the parked jobs whose turn it
// is: takeovers first, then the identities in turn.
func (s *scheduler) dispatchLocked() {
	s.signal()
	for i := 0; s.busy < s.limit && i < len(s.urgent); {
		t := s.urgent[i]
		if s.blocked[identity.Bucket(t.user)] {
			i++
			continue
		}
		s.busy++
		t.turn <- struct{}{}
		s.urgent = slices.Delete(s.urgent, i, i+1)
	}
	for s.busy < s.limit && len(s.ring) > 0 {
		found := false
		for i := range len(s.ring) {
			j := (s.next + i) % len(s.ring)
			user := s.ring[j]
			if s.blocked[identity.Bucket(user)] {
				continue
			}
			q := s.queues[user]
			t := q[0]
			s.busy++
			t.turn <- struct{}{}
			if len(q) == 1 {
				delete(s.queues, user)
				s.ring = slices.Delete(s.ring, j, j+1)
				s.next = j
			} else {
				s.queues[user] = q[1:]
				s.next = j + 1
			}
			if s.next >= len(s.ring) {
				s.next = 0
			}
			found = true
			break
		}
		if !found {
			return
		}
	}
}

// blockLocked passes user over, with every user sharing its limit (a
// key's), until one of their slots is released here or deferRecheck passed.
func (s *scheduler) blockLocked(user string) {
	s.blocked[identity.Bucket(user)] = true
	s.signal()
	if s.timer == nil && !s.stopped {
		s.timer = time.AfterFunc(deferRecheck, s.recheck)
	}
}

// recheck lets every blocked identity try again.
func (s *scheduler) recheck() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = nil
	clear(s.blocked)
	s.dispatchLocked()
}

// released frees a worker slot and lets user's parked jobs try again.
func (s *scheduler) released(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy--
	delete(s.blocked, identity.Bucket(user))
	s.dispatchLocked()
}

// stop ends the recheck timer; the worker calls it once no job is left.
func (s *scheduler) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}

// slotLease is a pool lease that also holds a worker slot.
type slotLease struct {
	s     *scheduler
	user  string
	lease pool.Lease
	once  sync.Once
}

// Release gives back the pool slot, then the worker slot.
func (l *slotLease) Release() {
	l.once.Do(func() {
		l.lease.Release()
		l.s.released(l.user)
	})
}
