package kafka

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
)

// Claims records which group member works on which job, and how many
// members have started it. Kafka keeps one committed offset per partition
// and no delivery count, so the Consumer asks Claims for what a Redis
// Streams pending entry knows: the attempt number that makes a worker send
// `reset`, and whether a job re-fetched after a rebalance is still being
// worked on by a live member (then it is left to that member) or is
// already finished (then it is skipped).
//
// An id names one message for one consumer group; ids are never reused
// (they include topic, partition, offset and request id). member is unique
// per Consumer incarnation, so a restarted process never inherits its dead
// predecessor's claims without counting an attempt. Implementations are
// safe for concurrent use by many processes and every call is bounded by
// ctx. A call that fails may or may not have taken effect; every call is
// safe to repeat.
type Claims interface {
	// Claim gives member the claim on id for ttl and returns the attempt
	// number: 1 for a job nobody claimed, the same number again when
	// member already holds it, one more than before when the previous
	// holder let its claim expire (a takeover). It returns an error
	// wrapping ErrClaimHeld while another member's claim is live and
	// ErrClaimDone once the job was released.
	Claim(ctx context.Context, id, member string, ttl time.Duration) (attempt int, err error)
	// Refresh extends member's claim on id by ttl from now. It returns an
	// error wrapping failover.ErrClaimLost when member does not hold the
	// claim (another member took over, or the job was released). A claim
	// that expired but was not taken over is still member's and is
	// extended.
	Refresh(ctx context.Context, id, member string, ttl time.Duration) error
	// Release marks id done for member, which must hold the claim (live
	// or expired, as long as nobody took it over): later Claims return
	// ErrClaimDone and Refresh reports the claim lost. It returns an error
	// wrapping failover.ErrClaimLost, and changes nothing, when another
	// member holds the claim: a stalled worker cannot finish the job its
	// successor answers. A job already done, or without a claim record,
	// is (still) recorded done.
	Release(ctx context.Context, id, member string) error
}

// ErrClaimHeld is wrapped by Claims.Claim while another member holds a live
// claim on the job: the caller must not start it, and asks again later.
var ErrClaimHeld = errors.New("kafka: job claimed by another member")

// ErrClaimDone is wrapped by Claims.Claim when the job was released
// (acknowledged or dead-lettered): the caller must not start it again.
var ErrClaimDone = errors.New("kafka: job already done")

// DefaultClaimRetention is how long RedisClaims keeps a claim record after
// its last change.
const DefaultClaimRetention = time.Hour

// ClaimKey returns the Redis key of the claim on id.
func ClaimKey(prefix, id string) string { return prefix + "claim:" + id }

// RedisClaimsConfig configures RedisClaims. Zero fields take the stated
// defaults.
type RedisClaimsConfig struct {
	// Prefix starts every key. Default "queue:" (QUEUE_PREFIX).
	Prefix string
	// Retention is how long a claim record lives after its last change.
	// It must outlast the longest time a finished job's offset can stay
	// uncommitted behind a slower job of its partition: a record that
	// expired early makes a re-fetched finished job run again, with
	// attempt 1. Default 1h; at least one minute.
	Retention time.Duration
}

// Validate reports whether cfg is usable. It does not change cfg.
func (cfg RedisClaimsConfig) Validate() error {
	if cfg.Retention < 0 || (cfg.Retention > 0 && cfg.Retention < time.Minute) {
		return fmt.Errorf("kafka: redis claims config: Retention %s is below 1m (0 means the default)", cfg.Retention)
	}
	return nil
}

var (
	//go:embed claim.lua
	claimSource string
	claimScript = redis.NewScript(claimSource)

	//go:embed refresh.lua
	refreshSource string
	refreshScript = redis.NewScript(refreshSource)

	//go:embed release.lua
	releaseSource string
	releaseScript = redis.NewScript(releaseSource)
)

// RedisClaims is Claims on Redis: one hash per job under
// ClaimKey(prefix, id) with fields member, attempt, expires_ms (Redis
// TIME) and done, expiring Retention after its last change. Safe for
// concurrent use. It never closes the client it was given.
type RedisClaims struct {
	client    redis.UniversalClient
	prefix    string
	retention time.Duration
}

var _ Claims = (*RedisClaims)(nil)

// DefaultClaimsPrefix is the default RedisClaimsConfig.Prefix, QUEUE_PREFIX's.
const DefaultClaimsPrefix = "queue:"

func (cfg RedisClaimsConfig) withDefaults() RedisClaimsConfig {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultClaimsPrefix
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultClaimRetention
	}
	return cfg
}

// NewRedisClaims returns RedisClaims on client. It does no I/O.
func NewRedisClaims(cfg RedisClaimsConfig, client redis.UniversalClient) (*RedisClaims, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("kafka: redis claims: nil client")
	}
	cfg = cfg.withDefaults()
	return &RedisClaims{client: client, prefix: cfg.Prefix, retention: cfg.Retention}, nil
}

// Claim implements Claims with one script run.
func (c *RedisClaims) Claim(ctx context.Context, id, member string, ttl time.Duration) (int, error) {
	key := ClaimKey(c.prefix, id)
	res, err := claimScript.Run(ctx, c.client, []string{key}, member, ttlMillis(ttl), c.retention.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("kafka: claim %s: %w", key, err)
	}
	if len(res) != 2 {
		return 0, fmt.Errorf("kafka: claim %s: unexpected reply %v", key, res)
	}
	attempt := int(res[1])
	switch res[0] {
	case 1:
		return attempt, nil
	case 0:
		return attempt, fmt.Errorf("kafka: claim %s: %w", key, ErrClaimHeld)
	default:
		return attempt, fmt.Errorf("kafka: claim %s: %w", key, ErrClaimDone)
	}
}

// Refresh implements Claims with one script run.
func (c *RedisClaims) Refresh(ctx context.Context, id, member string, ttl time.Duration) error {
	key := ClaimKey(c.prefix, id)
	n, err := refreshScript.Run(ctx, c.client, []string{key}, member, ttlMillis(ttl), c.retention.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("kafka: refresh claim %s: %w", key, err)
	}
	if n != 1 {
		return fmt.Errorf("kafka: refresh claim %s: not held by %s: %w", key, member, failover.ErrClaimLost)
	}
	return nil
}

// Release implements Claims with one script run: the owner check and the
// done mark are one step, so no takeover can fall between them.
func (c *RedisClaims) Release(ctx context.Context, id, member string) error {
	key := ClaimKey(c.prefix, id)
	n, err := releaseScript.Run(ctx, c.client, []string{key}, member, c.retention.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("kafka: release claim %s: %w", key, err)
	}
	if n != 1 {
		return fmt.Errorf("kafka: release claim %s: held by another member than %s: %w", key, member, failover.ErrClaimLost)
	}
	return nil
}

// ttlMillis rounds ttl up to whole milliseconds, at least one.
func ttlMillis(ttl time.Duration) int64 {
	return max(1, (ttl + time.Millisecond - 1).Milliseconds())
}
