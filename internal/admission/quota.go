package admission

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Defaults of zero QuotaConfig fields, the settings' defaults
// (docs/OPERATIONS.md, QUEUE_MAX_PER_IDENTITY and QUEUE_MAX_BYTES).
const (
	DefaultQueueMaxPerIdentity = 100
	DefaultQueueMaxBytes       = 256 << 20
)

// DefaultQuotaRetryAfter is advised to a refused client: about the time
// for some of its own jobs to start.
const DefaultQuotaRetryAfter = 2 * time.Second

// QuotaConfig configures the queue quota.
type QuotaConfig struct {
	// Prefix is QUEUE_PREFIX. Required.
	Prefix string
	// MaxPerIdentity is QUEUE_MAX_PER_IDENTITY. Default 100.
	MaxPerIdentity int
	// MaxBytes is QUEUE_MAX_BYTES. Default 256 MiB.
	MaxBytes int64
	// RetryAfter is advised with a refusal. Default 2s.
	RetryAfter time.Duration
}

func (c QuotaConfig) withDefaults() QuotaConfig {
	if c.MaxPerIdentity == 0 {
		c.MaxPerIdentity = DefaultQueueMaxPerIdentity
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultQueueMaxBytes
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultQuotaRetryAfter
	}
	return c
}

// Validate reports bad values without changing c, each field out of range
// as a *bounds.Error. It checks the fields as given: NewQuota fills the
// zero fields that have a default before it calls Validate.
func (c QuotaConfig) Validate() error {
	errs := []error{
		bounds.AtLeast("MaxPerIdentity", c.MaxPerIdentity, 1),
		bounds.AtLeast("MaxBytes", c.MaxBytes, 0),
		bounds.AtLeast("RetryAfter", c.RetryAfter, 0),
	}
	if c.Prefix == "" {
		errs = append(errs, errors.New("a prefix is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("admission: quota: %w", err)
	}
	return nil
}

var (
	//go:embed quota_reserve.lua
	quotaReserveLua string
	//go:embed quota_release.lua
	quotaReleaseLua string

	quotaReserve = redis.NewScript(quotaReserveLua)
	quotaRelease = redis.NewScript(quotaReleaseLua)
)

// Quota counts the jobs waiting in the queue, per identity and in bytes,
// across every api process (docs/OPERATIONS.md, "Isolation"). It lives
// in Redis, which embedded mode runs in process (miniredis). Each entry
// expires at its job's queue deadline, so an api that dies between
// Reserve and Release leaks nothing past that. Safe for concurrent use.
type Quota struct {
	cfg QuotaConfig
	rdb redis.Scripter
}

// NewQuota returns the quota on rdb, which it does not close.
func NewQuota(cfg QuotaConfig, rdb redis.Scripter) (*Quota, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil {
		return nil, errors.New("admission: quota needs a Redis client")
	}
	return &Quota{cfg: cfg, rdb: rdb}, nil
}

// Every key carries the {quota} hash tag: the scripts touch an identity's
// set and the shared ones together, so they must share a cluster slot.
func (q *Quota) keys(who string) []string {
	p := q.cfg.Prefix + "{quota}:"
	return []string{q.idKey(who), p + "jobs", p + "bytes", p + "total"}
}

// idKey names the set of who's waiting jobs: its identity.Bucket's, so a
// key's users share their key's QUEUE_MAX_PER_IDENTITY.
func (q *Quota) idKey(who string) string {
	return q.cfg.Prefix + "{quota}:id:" + identity.Bucket(who)
}

// Reserve counts the job requestID of identity, of size bytes, for at
// most wait. A bound that refuses it gives the problem to answer:
// too-many-queued (429) for the identity's limit, queue-overflow (503)
// for the bytes; err is a Redis failure (an OOM, an outage), wrapped.
func (q *Quota) Reserve(ctx context.Context, identity, requestID string, bytes int, wait time.Duration) (*protocol.Problem, error) {
	res, err := quotaReserve.Run(ctx, q.rdb, q.keys(identity),
		requestID, bytes, max(1, wait.Milliseconds()), q.cfg.MaxPerIdentity, q.cfg.MaxBytes).Int()
	if err != nil {
		return nil, fmt.Errorf("admission: reserve queue quota: %w", err)
	}
	retryAfter := protocol.RetryAfterSeconds(q.cfg.RetryAfter)
	switch res {
	case 1:
		return protocol.TooManyQueued(retryAfter), nil
	case 2:
		return protocol.QueueOverflow(retryAfter), nil
	}
	return nil, nil
}

// Release uncounts the job; releasing twice changes nothing.
func (q *Quota) Release(ctx context.Context, identity, requestID string) error {
	return q.ReleaseMany(ctx, []string{identity}, []string{requestID})
}

// ReleaseMany uncounts the jobs requestIDs[i] of identities[i] in one
// call (one script run), as Release does each. The slices have the same
// length.
func (q *Quota) ReleaseMany(ctx context.Context, identities, requestIDs []string) error {
	if len(identities) != len(requestIDs) {
		return fmt.Errorf("admission: release queue quota: %d identities for %d jobs", len(identities), len(requestIDs))
	}
	if len(requestIDs) == 0 {
		return nil
	}
	p := q.cfg.Prefix + "{quota}:"
	keys := make([]string, 3, 3+len(requestIDs))
	keys[0], keys[1], keys[2] = p+"jobs", p+"bytes", p+"total"
	args := make([]any, len(requestIDs))
	for i, id := range requestIDs {
		keys = append(keys, q.idKey(identities[i]))
		args[i] = id
	}
	if err := quotaRelease.Run(ctx, q.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("admission: release queue quota: %w", err)
	}
	return nil
}
