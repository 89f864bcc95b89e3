package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
)

// minRedisPoolSize is the least connections per Redis node a process keeps
// by default: waiting clients hold none each (Pub/Sub is multiplexed), but
// enqueues, cancels and pool scripts need a few under load.
const minRedisPoolSize = 64

// maxIdleShare is the share of REDIS_POOL_SIZE a node's pool keeps open
// while idle (1/maxIdleShare; never fewer than the two connections each
// of WORKER_CONCURRENCY workers may hold at once, nor than
// REDIS_MIN_IDLE_CONNS). go-redis keeps every connection a burst opened
// until it has been idle for 30 minutes, and only notices that when it
// takes it again, which in a pool that hands out the most recent first
// never comes: after a burst the api kept 64 connections of 64 KiB of
// buffers each (docs/OPERATIONS.md, "Memory after a burst"). A connection
// given back when this many are idle is closed instead; one that is busy
// stays, so the pool still grows to REDIS_POOL_SIZE under load, and only
// a swing of more than this many connections between two moments costs
// dials: never a consumer's workers alone.
const maxIdleShare = 4

// NewRedisClient returns the Redis client cfg asks for: one Redis
// (REDIS_URL), a Redis Cluster (REDIS_CLUSTER_ADDRS) or the primary that
// Sentinels name (REDIS_SENTINEL_ADDRS), every one as a
// redis.UniversalClient so the components above do not care which. It
// does no I/O. The caller closes the client (components never do). In
// embedded mode it returns an error: the caller starts miniredis itself.
//
// The connection pool and its timeouts come from REDIS_POOL_SIZE,
// REDIS_MIN_IDLE_CONNS, REDIS_DIAL_TIMEOUT_MS, REDIS_TIMEOUT_MS and
// REDIS_POOL_TIMEOUT_MS (docs/OPERATIONS.md, "Redis busy or down"); a
// quarter of the pool, or two per worker or REDIS_MIN_IDLE_CONNS if more,
// stays open while idle (maxIdleShare).
// Context deadlines bound every command too (ContextTimeoutEnabled), so a
// hung Redis cannot hang a request. Cluster clients follow MOVED and ASK
// redirections and refresh the slot map on a failover; Sentinel clients
// follow the primary the Sentinels announce.
func NewRedisClient(cfg *config.Config) (redis.UniversalClient, error) {
	if cfg == nil {
		return nil, errors.New("app: redis client: nil config")
	}
	poolSize := cfg.RedisPoolSize
	if poolSize == 0 {
		poolSize = max(minRedisPoolSize, 2*cfg.WorkerConcurrency+8)
	}
	return newRedisClient(cfg, poolSize, cfg.RedisMinIdleConns,
		maxIdleConns(poolSize, cfg.WorkerConcurrency, cfg.RedisMinIdleConns), false)
}

// maxIdleConns is how many connections a node's pool of poolSize keeps
// idle (see maxIdleShare).
func maxIdleConns(poolSize, workers, minIdle int) int {
	return max(1, poolSize/maxIdleShare, 2*workers, minIdle)
}

// NewRedisProbeClient returns a client like NewRedisClient's with one
// connection per node, none kept idle and no retries: the pool's health
// probe, which must not queue behind the busy connections of the main
// client to learn whether Redis answers, and must see a refused dial as
// one (not retried into a timeout).
func NewRedisProbeClient(cfg *config.Config) (redis.UniversalClient, error) {
	if cfg == nil {
		return nil, errors.New("app: redis client: nil config")
	}
	return newRedisClient(cfg, 1, 0, 1, true)
}

func newRedisClient(cfg *config.Config, poolSize, minIdle, maxIdle int, probe bool) (redis.UniversalClient, error) {
	retries := 0 // go-redis's default
	if probe {
		retries = -1
	}
	dial := cfg.RedisDialTimeout
	rw := cfg.RedisTimeout
	wait := cfg.RedisPoolTimeout
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
		opts.PoolSize, opts.MinIdleConns, opts.MaxIdleConns = poolSize, minIdle, maxIdle
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout = dial, rw, rw, wait
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries = retries
		return redis.NewClient(nodeOptions(opts, probe)), nil
	case config.RedisModeCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:        append([]string(nil), cfg.RedisClusterAddrs...),
			Password:     cfg.RedisPassword,
			PoolSize:     poolSize,
			MinIdleConns: minIdle,
			MaxIdleConns: maxIdle,
			DialTimeout:  dial, ReadTimeout: rw, WriteTimeout: rw, PoolTimeout: wait,
			MaxRetries:            retries,
			ContextTimeoutEnabled: true,
			NewClient: func(o *redis.Options) *redis.Client {
				return redis.NewClient(nodeOptions(o, probe))
			},
		}), nil
	case config.RedisModeSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:       cfg.RedisSentinelMaster,
			SentinelAddrs:    append([]string(nil), cfg.RedisSentinelAddrs...),
			SentinelPassword: cfg.RedisSentinelPassword,
			Password:         cfg.RedisPassword,
			PoolSize:         poolSize,
			MinIdleConns:     minIdle,
			MaxIdleConns:     maxIdle,
			DialTimeout:      dial, ReadTimeout: rw, WriteTimeout: rw, PoolTimeout: wait,
			MaxRetries:            retries,
			ContextTimeoutEnabled: true,
		}), nil
	default:
		return nil, errors.New("app: redis client: embedded mode has no Redis to connect to (set REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS)")
	}
}

// nodeOptions finishes the options of one node's client: the probe's, or
// the main client's dial retries (redispool.ClientOptions).
func nodeOptions(o *redis.Options, probe bool) *redis.Options {
	if probe {
		return redispool.ProbeOptions(o)
	}
	return redispool.ClientOptions(o)
}

// switchMasterChannel is where Sentinels announce a failover:
// "<master name> <old ip> <old port> <new ip> <new port>".
const switchMasterChannel = "+switch-master"

// sentinelRetry paces WatchPrimarySwitch between unreachable Sentinels.
const sentinelRetry = time.Second

// WatchPrimarySwitch calls onSwitch with the new primary's address each
// time the Sentinels announce a failover of REDIS_SENTINEL_MASTER, until
// ctx ends. It listens to one Sentinel at a time and moves to the next
// when that one fails. It returns at once outside Sentinel mode.
//
// The api needs it for its result subscriptions: go-redis moves commands
// to the new primary by itself but not open Pub/Sub connections, which
// would stay subscribed on the demoted primary while workers publish on
// the new one (docs/OPERATIONS.md, "Redis Cluster and Sentinel").
func WatchPrimarySwitch(ctx context.Context, cfg *config.Config, log *slog.Logger, onSwitch func(addr string)) {
	if cfg == nil || cfg.RedisMode() != config.RedisModeSentinel {
		return
	}
	for i := 0; ctx.Err() == nil; i++ {
		addr := cfg.RedisSentinelAddrs[i%len(cfg.RedisSentinelAddrs)]
		err := watchSentinel(ctx, addr, cfg, onSwitch)
		if ctx.Err() != nil {
			return
		}
		log.Warn("sentinel watch interrupted; trying the next sentinel", "sentinel", addr, "err", err)
		t := time.NewTimer(sentinelRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// watchSentinel listens on one Sentinel until ctx ends or the connection
// fails.
func watchSentinel(ctx context.Context, addr string, cfg *config.Config, onSwitch func(addr string)) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr, Password: cfg.RedisSentinelPassword, MaxRetries: -1})
	defer sc.Close()
	ps := sc.Subscribe(ctx, switchMasterChannel)
	defer ps.Close()
	// A blocked read does not watch ctx: closing the PubSub ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		return fmt.Errorf("app: subscribe %s on sentinel: %w", switchMasterChannel, err)
	}
	for {
		msg, err := ps.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("app: read sentinel announcements: %w", err)
		}
		f := strings.Fields(msg.Payload)
		if len(f) == 5 && f[0] == cfg.RedisSentinelMaster {
			onSwitch(net.JoinHostPort(f[3], f[4]))
		}
	}
}
