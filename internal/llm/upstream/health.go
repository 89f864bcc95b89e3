package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
)

// Health defaults (LLM_UPSTREAM_MAX_FAILS, LLM_UPSTREAM_COOLDOWN_SECONDS).
const (
	DefaultMaxFails = 3
	DefaultCooldown = 30 * time.Second
)

// trialRetry is how long a process that lost the claim on a trial waits
// before claiming again: the winner's call decides meanwhile.
const trialRetry = time.Second

// State is an upstream's health as routing sees it.
type State int

// Health states.
const (
	// Healthy upstreams take their full share.
	Healthy State = iota
	// Ejected upstreams sit out a cooldown or a Retry-After.
	Ejected
	// Trial upstreams have sat out their time and wait for one probe or
	// one trial call to decide.
	Trial
)

// String returns the state's name for logs.
func (s State) String() string {
	switch s {
	case Healthy:
		return "healthy"
	case Ejected:
		return "ejected"
	case Trial:
		return "trial"
	}
	return "unknown"
}

// HealthConfig configures the health implementations.
type HealthConfig struct {
	// MaxFails is how many consecutive retryable failures before the first
	// chunk eject an upstream (LLM_UPSTREAM_MAX_FAILS). Default 3.
	MaxFails int
	// Cooldown is how long an ejected upstream sits out, and how long a
	// claimed trial stays claimed (LLM_UPSTREAM_COOLDOWN_SECONDS). Whole
	// milliseconds. Default 30s.
	Cooldown time.Duration
}

// Validate reports each field out of range as a *bounds.Error. It checks
// the fields as given: NewRedisHealth fills the zero ones with their
// defaults before it calls Validate.
func (c HealthConfig) Validate() error {
	errs := []error{
		bounds.AtLeast("MaxFails", c.MaxFails, 1),
		bounds.AtLeast("Cooldown", c.Cooldown, time.Millisecond),
	}
	if c.Cooldown%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("Cooldown %s is not whole milliseconds", c.Cooldown))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("upstream: health: %w", err)
	}
	return nil
}

func (c HealthConfig) withDefaults() HealthConfig {
	if c.MaxFails == 0 {
		c.MaxFails = DefaultMaxFails
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	return c
}

// Failure describes one retryable failure before the first chunk.
type Failure struct {
	// SitOut, when above 0, ejects the upstream at once for that long: a
	// 429's Retry-After, already capped by the caller.
	SitOut time.Duration
	// Trial says the failed call was the upstream's trial (or probe): it
	// sits out another cooldown at once.
	Trial bool
	// Reason is logged and kept with the ejection.
	Reason string
}

// Health tracks which upstreams (index i of the Spec list the
// implementation was built with) take calls. Implementations are safe for
// concurrent use.
//
// State answers from memory, without I/O. ClaimTrial returns true to
// exactly one caller (cluster-wide for Redis) per Cooldown while upstream i
// is in Trial. Failed records a failure and reports whether this call
// ejected the upstream (so exactly one log line is written cluster-wide);
// Succeeded records a probe's 2xx or a call's first chunk and reports
// whether this call brought the upstream back from a trial. On a Redis
// error Failed and Succeeded return it; the state is left as it was.
// Changed returns a channel closed at the next change of any state.
type Health interface {
	State(i int) State
	ClaimTrial(ctx context.Context, i int) bool
	Failed(ctx context.Context, i int, f Failure) (ejected bool, err error)
	Succeeded(ctx context.Context, i int) (returned bool, err error)
	Changed() <-chan struct{}
}

// ProbeLocker is the optional ability of a Health to let one process at a
// time run the active probe: TryProbeLock returns true to one caller per
// every.
type ProbeLocker interface {
	TryProbeLock(ctx context.Context, every time.Duration) bool
}

// LocalHealth is in-process Health for embedded mode and the local pool.
type LocalHealth struct {
	cfg    HealthConfig
	now    func() time.Time
	mu     sync.Mutex
	ups    []localHealthState
	change notifier
}

type localHealthState struct {
	fails      int
	downUntil  time.Time
	suspect    bool
	trialUntil time.Time
}

var _ Health = (*LocalHealth)(nil)

// NewLocalHealth returns in-process health for n upstreams. now is the
// clock; nil means time.Now.
func NewLocalHealth(n int, cfg HealthConfig, now func() time.Time) *LocalHealth {
	if now == nil {
		now = time.Now
	}
	return &LocalHealth{cfg: cfg.withDefaults(), now: now, ups: make([]localHealthState, n)}
}

// State returns upstream i's state.
func (h *LocalHealth) State(i int) State {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stateLocked(i, h.now())
}

func (h *LocalHealth) stateLocked(i int, now time.Time) State {
	u := &h.ups[i]
	switch {
	case now.Before(u.downUntil):
		return Ejected
	case u.suspect:
		return Trial
	}
	return Healthy
}

// ClaimTrial gives upstream i's trial to the first caller per Cooldown.
func (h *LocalHealth) ClaimTrial(_ context.Context, i int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if h.stateLocked(i, now) != Trial || now.Before(h.ups[i].trialUntil) {
		return false
	}
	h.ups[i].trialUntil = now.Add(h.cfg.Cooldown)
	return true
}

// Failed records f on upstream i.
func (h *LocalHealth) Failed(_ context.Context, i int, f Failure) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	u := &h.ups[i]
	st := h.stateLocked(i, now)
	if st == Ejected {
		return false, nil
	}
	sitOut := f.SitOut
	if sitOut <= 0 {
		if !f.Trial && st != Trial {
			u.fails++
			if u.fails < h.cfg.MaxFails {
				return false, nil
			}
		}
		sitOut = h.cfg.Cooldown
	}
	*u = localHealthState{downUntil: now.Add(sitOut), suspect: true}
	h.change.notify()
	return true, nil
}

// Succeeded clears upstream i's failures and ends its trial.
func (h *LocalHealth) Succeeded(_ context.Context, i int) (bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	u := &h.ups[i]
	u.fails = 0
	if h.stateLocked(i, h.now()) != Trial {
		return false, nil
	}
	u.suspect, u.trialUntil = false, time.Time{}
	h.change.notify()
	return true, nil
}

// Changed returns a channel closed at the next ejection or return. A
// cooldown that runs out is not a notified change: waiters recheck on a
// timer.
func (h *LocalHealth) Changed() <-chan struct{} { return h.change.wait() }

// TryProbeLock always succeeds: there is one process.
func (h *LocalHealth) TryProbeLock(context.Context, time.Duration) bool { return true }
