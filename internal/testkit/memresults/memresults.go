// Package memresults is the result-and-cancel channel of
// internal/failover/results in one process, for tests: Memory has Redis'
// semantics and runs inside a testing/synctest bubble.
package memresults

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
)

// DefaultBuffer is the default Config.Buffer, the same as the
// Redis subscriber's (pubsub.DefaultBuffer).
const DefaultBuffer = 256

// cancelBuffer is how many announcements a cancel stream holds for a slow
// watcher before it drops them; a dropped one still reaches the job
// through Cancelled or an unheard publish, as a lost Redis notice does.
const cancelBuffer = 1024

// ErrDuplicate is returned by SubscribeResults for a request that
// already has a subscription, as pubsub.ErrDuplicate is on Redis.
var ErrDuplicate = errors.New("memresults: request already subscribed")

// Config configures a Memory.
type Config struct {
	// Buffer is results held per subscription before it ends with
	// failover.ErrResultOverflow. Zero means DefaultBuffer.
	Buffer int
}

// Memory is both halves of the result-and-cancel channel in one process,
// with Redis' semantics: a result reaches only subscriptions open when it
// is published, a cancellation is a mark with a time to live plus an
// announcement to every watcher. It starts no goroutine and waits only on
// channels, so it runs inside a testing/synctest bubble. Safe for
// concurrent use.
type Memory struct {
	buffer int

	mu       sync.Mutex
	subs     map[string]*memSub
	marks    map[string]time.Time // request id → cancel mark expiry
	watchers map[*memCancels]struct{}
	ops      int64
}

var (
	_ failover.ResultPublisher  = (*Memory)(nil)
	_ failover.ResultSubscriber = (*Memory)(nil)
	_ failover.Canceller        = (*Memory)(nil)
	_ failover.CancelWatcher    = (*Memory)(nil)
)

// NewMemory returns an empty Memory.
func New(cfg Config) (*Memory, error) {
	if cfg.Buffer < 0 {
		return nil, errors.New("memresults: memory Buffer must not be negative")
	}
	if cfg.Buffer == 0 {
		cfg.Buffer = DefaultBuffer
	}
	return &Memory{buffer: cfg.Buffer, subs: map[string]*memSub{}, marks: map[string]time.Time{},
		watchers: map[*memCancels]struct{}{}}, nil
}

// ResultsFor returns the sink of requestID's results.
func (m *Memory) ResultsFor(requestID string) failover.ResultSink {
	return memSink{m: m, id: requestID}
}

// memSink publishes one request's results into a Memory.
type memSink struct {
	m  *Memory
	id string
}

func (s memSink) Publish(ctx context.Context, msg []byte) (bool, error) {
	return s.m.PublishResult(ctx, s.id, msg)
}

// PublishPair delivers first then second.
func (s memSink) PublishPair(ctx context.Context, first, second []byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	a, err := s.m.PublishResult(ctx, s.id, first)
	if err != nil {
		return false, err
	}
	b, err := s.m.PublishResult(ctx, s.id, second)
	return a && b, err
}

var _ failover.ResultSink = memSink{}

// PublishResult delivers msg to requestID's subscription, if any. A
// subscription whose buffer is full ends with failover.ErrResultOverflow.
func (m *Memory) PublishResult(ctx context.Context, requestID string, msg []byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops++
	s := m.subs[requestID]
	if s == nil {
		return false, nil
	}
	select {
	case s.c <- append([]byte(nil), msg...):
		s.readyLocked()
	default:
		m.endLocked(s, failover.ErrResultOverflow)
	}
	return true, nil
}

// SubscribeResults opens requestID's subscription at once.
func (m *Memory) SubscribeResults(ctx context.Context, requestID string) (failover.ResultSubscription, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops++
	if m.subs[requestID] != nil {
		return nil, ErrDuplicate
	}
	s := &memSub{m: m, id: requestID, c: make(chan []byte, m.buffer), done: make(chan struct{})}
	m.subs[requestID] = s
	return s, nil
}

// Cancel marks requestID cancelled for ttl and announces it to every
// watcher.
func (m *Memory) Cancel(ctx context.Context, requestID string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops++
	m.marks[requestID] = time.Now().Add(ttl)
	for w := range m.watchers {
		select {
		case w.c <- requestID:
		default:
		}
	}
	return nil
}

// Cancelled reports whether requestID carries a live cancel mark.
func (m *Memory) Cancelled(ctx context.Context, requestID string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ops++
	exp, ok := m.marks[requestID]
	return ok && time.Now().Before(exp), nil
}

// WatchCancels returns a stream of the announcements made from now on.
func (m *Memory) WatchCancels(ctx context.Context) (failover.CancelStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &memCancels{m: m, c: make(chan string, cancelBuffer)}
	m.watchers[w] = struct{}{}
	return w, nil
}

// Subscribed reports whether requestID has an open subscription.
func (m *Memory) Subscribed(requestID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.subs[requestID] != nil
}

// Watchers returns how many cancel streams are open.
func (m *Memory) Watchers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.watchers)
}

// CancelMark returns the time to live left on requestID's cancel mark,
// and false when it has none.
func (m *Memory) CancelMark(requestID string) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	exp, ok := m.marks[requestID]
	if !ok {
		return 0, false
	}
	return time.Until(exp), true
}

// Ops counts the calls made on the channel (publish, subscribe, cancel,
// cancel check), as a Redis server counts commands.
func (m *Memory) Ops() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ops
}

// Drop ends requestID's subscription as a lost connection would.
func (m *Memory) Drop(requestID string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.subs[requestID]; s != nil {
		m.endLocked(s, err)
	}
}

// endLocked ends s; err nil means its own Close.
func (m *Memory) endLocked(s *memSub, err error) {
	if s.ended {
		return
	}
	s.ended = true
	delete(m.subs, s.id)
	if err != nil {
		s.err = err
		close(s.done)
	}
	close(s.c)
	s.readyLocked()
}

// memSub is one Memory subscription.
type memSub struct {
	m     *Memory
	id    string
	c     chan []byte
	done  chan struct{}
	err   error  // written before done is closed, under m.mu
	ended bool   // guarded by m.mu
	ready func() // OnReady's function, guarded by m.mu
}

// OnReady calls f once, when the subscription has a message to read or
// has ended (at once when it already has), as pubsub.Subscription does;
// f runs with the Memory locked and must not block.
func (s *memSub) OnReady(f func()) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.ready = f
	if s.ended || len(s.c) > 0 {
		s.readyLocked()
	}
}

func (s *memSub) readyLocked() {
	if f := s.ready; f != nil {
		s.ready = nil
		f()
	}
}

func (s *memSub) C() <-chan []byte      { return s.c }
func (s *memSub) Done() <-chan struct{} { return s.done }

func (s *memSub) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

func (s *memSub) Close() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.endLocked(s, nil)
}

// memCancels is one Memory cancel stream.
type memCancels struct {
	m      *Memory
	c      chan string
	closed bool // guarded by m.mu
}

func (w *memCancels) C() <-chan string { return w.c }

func (w *memCancels) Close() {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	if !w.closed {
		w.closed = true
		delete(w.m.watchers, w)
		close(w.c)
	}
}
