package kafka

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
)

// memClaims is Claims in memory, for tests: the same rules as claim.lua
// and refresh.lua, on the test process's clock.
type memClaims struct {
	mu   sync.Mutex
	recs map[string]*memClaim
	// calls counts Claim calls, so tests can see that Fetch consulted it.
	calls int
}

type memClaim struct {
	member  string
	attempt int
	expires time.Time
	done    bool
}

var _ Claims = (*memClaims)(nil)

func newMemClaims() *memClaims { return &memClaims{recs: make(map[string]*memClaim)} }

func (m *memClaims) Claim(ctx context.Context, id, member string, ttl time.Duration) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	now := time.Now()
	r := m.recs[id]
	if r == nil {
		r = &memClaim{}
		m.recs[id] = r
	}
	switch {
	case r.done:
		return r.attempt, fmt.Errorf("memclaims %s: %w", id, ErrClaimDone)
	case r.member != "" && r.member != member && r.expires.After(now):
		return r.attempt, fmt.Errorf("memclaims %s: %w", id, ErrClaimHeld)
	case r.member != member:
		r.attempt++
	}
	r.member, r.expires = member, now.Add(ttl)
	return r.attempt, nil
}

func (m *memClaims) Refresh(ctx context.Context, id, member string, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.recs[id]
	if r == nil || r.done || r.member != member {
		return fmt.Errorf("memclaims %s: %w", id, failover.ErrClaimLost)
	}
	r.expires = time.Now().Add(ttl)
	return nil
}

func (m *memClaims) Release(ctx context.Context, id, member string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.recs[id]
	if r == nil {
		r = &memClaim{}
		m.recs[id] = r
	}
	if !r.done && r.member != "" && r.member != member {
		return fmt.Errorf("memclaims %s: held by %s: %w", id, r.member, failover.ErrClaimLost)
	}
	r.done = true
	return nil
}

func (m *memClaims) claimCalls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}
