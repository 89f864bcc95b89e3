package app

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/config"
)

// minRedisPoolSize is the least connections per Redis node a process keeps:
// waiting clients hold none each (Pub/Sub is multiplexed), but enqueues,
// cancels and pool scripts need a few under load.
const minRedisPoolSize = 64

// NewRedisClient returns the Redis client cfg asks for: one Redis
// (REDIS_URL), a Redis Cluster (REDIS_CLUSTER_ADDRS) or the primary that
// Sentinels name (REDIS_SENTINEL_ADDRS), every one as a
// redis.UniversalClient so the components above do not care which. It
// does no I/O. The caller closes the client (components never do). In
// embedded mode it returns an error: the caller starts miniredis itself.
//
// Context deadlines bound every command (ContextTimeoutEnabled), so a hung
// Redis cannot hang a request. Cluster clients follow MOVED and ASK
// redirections and refresh the slot map on a failover; Sentinel clients
// follow the primary the Sentinels announce (docs/OPERATIONS.md).
func NewRedisClient(cfg *config.Config) (redis.UniversalClient, error) {
	if cfg == nil {
		return nil, errors.New("app: redis client: nil config")
	}
	poolSize := max(minRedisPoolSize, 2*cfg.WorkerConcurrency+8)
	switch cfg.RedisMode() {
	case config.RedisModeSingle:
		opts, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			// The URL is not echoed: it may carry a password.
			if ue, ok := errors.AsType[*url.Error](err); ok {
				err = ue.Err
			}
			return nil, fmt.Errorf("app: redis client: REDIS_URL: %w", err)
		}
		opts.PoolSize = max(opts.PoolSize, poolSize)
		opts.ContextTimeoutEnabled = true
		return redis.NewClient(opts), nil
	case config.RedisModeCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 append([]string(nil), cfg.RedisClusterAddrs...),
			Password:              cfg.RedisPassword,
			PoolSize:              poolSize,
			ContextTimeoutEnabled: true,
		}), nil
	case config.RedisModeSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:            cfg.RedisSentinelMaster,
			SentinelAddrs:         append([]string(nil), cfg.RedisSentinelAddrs...),
			SentinelPassword:      cfg.RedisSentinelPassword,
			Password:              cfg.RedisPassword,
			PoolSize:              poolSize,
			ContextTimeoutEnabled: true,
		}), nil
	default:
		return nil, errors.New("app: redis client: embedded mode has no Redis to connect to (set REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS)")
	}
}
