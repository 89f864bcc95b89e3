// Package adaptive owns adaptive concurrency (AIMD): a limit on the calls
// at once toward a provider that halves when the provider pushes back and
// grows by one after each interval that went well, kept in a Store that
// every process obeying the limit reads (docs/OPERATIONS.md, "Adaptive
// concurrency").
//
// The rule, per named limit, between Params.Floor and Params.Ceiling:
// a throttle (an upstream 429 or 503, or an interval whose first-token
// p99 crossed the target) marks the current interval throttled and, at
// most once per Params.Interval, multiplies the limit by 0.5; an interval
// that had calls and no throttle adds 1 when it closes. A limit starts at
// the ceiling: a healthy provider loses nothing, and the first 429 halves
// it.
//
// State.Apply is the rule in Go; LocalStore keeps it in process, and the
// Redis pool (internal/pool/redispool) runs the same rule in a Lua script
// so that one limit is shared by every api and consumer. A Controller,
// one per named limit, turns the calls a process sees into reports.
package adaptive

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
)

// Defaults of the settings of Params (ADAPTIVE_CONCURRENCY_FLOOR,
// ADAPTIVE_INTERVAL_MS); Ceiling is the pool's size.
const (
	// DefaultFloor is the lowest an adaptive limit goes by default.
	DefaultFloor = 1
	// DefaultInterval is the pace of an adaptive limit by default.
	DefaultInterval = time.Second
	// MinInterval is the shortest Params.Interval: it keeps a shared
	// limit's Redis traffic (one script per process per interval) small.
	MinInterval = 100 * time.Millisecond
)

// Params bound and pace one limit. Every process reporting on a name
// must use the same Params.
type Params struct {
	// Floor is the lowest the limit goes (ADAPTIVE_CONCURRENCY_FLOOR). At
	// least 1.
	Floor int
	// Ceiling is the highest, and the start (CONNECTION_POOL_SIZE). At
	// least Floor.
	Ceiling int
	// Interval is the pace (ADAPTIVE_INTERVAL_MS): at most one decrease
	// per Interval, and +1 after each Interval with calls and no throttle.
	// At least MinInterval.
	Interval time.Duration
}

// Validate reports bad values, a field out of range as a *bounds.Error.
func (p Params) Validate() error {
	errs := []error{
		bounds.AtLeast("Floor", p.Floor, 1),
		bounds.AtLeast("Interval", p.Interval, MinInterval),
	}
	if p.Ceiling < p.Floor {
		errs = append(errs, fmt.Errorf("ceiling %d must be at least the floor %d", p.Ceiling, p.Floor))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("adaptive: %w", err)
	}
	return nil
}

// Report is what one process tells the store about one limit.
type Report struct {
	// Calls is how many calls ended since the previous report.
	Calls int64
	// Throttle says the provider pushed back: an upstream 429 or 503, or
	// an interval whose first-token p99 crossed the target.
	Throttle bool
}

// State is one limit and the interval being counted.
type State struct {
	// Limit is the calls at once allowed; 0 before the first Apply.
	Limit int
	// WindowStart is when the current interval began.
	WindowStart time.Time
	// Calls counts the calls reported in the current interval.
	Calls int64
	// Throttled says the current interval saw a throttle.
	Throttled bool
	// LastDecrease is when the limit was last halved; zero for never.
	LastDecrease time.Time
}

// Apply applies r, reported at now, to s under p and returns whether the
// limit grew (its waiters may now be served). It closes the current
// interval first when it has run its course, counting r's calls in it,
// since they were made during it.
func (s *State) Apply(r Report, now time.Time, p Params) (grew bool) {
	if s.Limit == 0 {
		s.Limit, s.WindowStart = p.Ceiling, now
	}
	s.Limit = min(max(s.Limit, p.Floor), p.Ceiling)
	s.Calls += r.Calls
	if !now.Before(s.WindowStart.Add(p.Interval)) {
		if s.Calls > 0 && !s.Throttled && s.Limit < p.Ceiling {
			s.Limit++
			grew = true
		}
		s.WindowStart, s.Calls, s.Throttled = now, 0, false
	}
	if r.Throttle {
		s.Throttled = true
		if s.LastDecrease.IsZero() || !now.Before(s.LastDecrease.Add(p.Interval)) {
			s.Limit = max(p.Floor, s.Limit/2)
			s.LastDecrease = now
		}
	}
	return grew
}

// Store keeps named limits. Report applies one process's report to the
// limit called name and returns the limit after it, atomically: several
// processes may report on one name at once. Implementations are safe for
// concurrent use; Report is bounded by ctx.
type Store interface {
	Report(ctx context.Context, name string, r Report, p Params) (limit int, err error)
}

// LocalStore is a Store in this process's memory: a local pool's limit.
type LocalStore struct {
	now func() time.Time

	mu     sync.Mutex
	states map[string]*State
}

var _ Store = (*LocalStore)(nil)

// NewLocalStore returns an empty store on the wall clock.
func NewLocalStore() *LocalStore {
	return &LocalStore{now: time.Now, states: make(map[string]*State)}
}

// Report applies r to the limit called name.
func (l *LocalStore) Report(_ context.Context, name string, r Report, p Params) (int, error) {
	if err := p.Validate(); err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.states[name]
	if s == nil {
		s = &State{}
		l.states[name] = s
	}
	s.Apply(r, l.now(), p)
	return s.Limit, nil
}
