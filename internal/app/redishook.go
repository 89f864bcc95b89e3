package app

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// redisTimer observes every command of a client in
// spillway_redis_command_seconds{op}, so an operator sees Redis slow down
// before it hurts (docs/OPERATIONS.md, "Redis busy or down"). op is the
// command's name in lower case (evalsha for scripts), or pipeline: a small,
// fixed set, since only our own code issues commands. Blocking reads
// (XREADGROUP with BLOCK, Pub/Sub receives) wait on purpose and are not
// observed.
type redisTimer struct{ seconds *prometheus.HistogramVec }

var _ redis.Hook = redisTimer{}

func (redisTimer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisTimer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if blocking(cmd) {
			return next(ctx, cmd)
		}
		start := time.Now()
		err := next(ctx, cmd)
		h.seconds.WithLabelValues(strings.ToLower(cmd.Name())).Observe(time.Since(start).Seconds())
		return err
	}
}

func (h redisTimer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		h.seconds.WithLabelValues("pipeline").Observe(time.Since(start).Seconds())
		return err
	}
}

// blocking reports whether cmd waits for data by design.
func blocking(cmd redis.Cmder) bool {
	name := strings.ToLower(cmd.Name())
	if strings.HasSuffix(name, "subscribe") {
		return true
	}
	switch name {
	case "xread", "xreadgroup":
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.EqualFold(s, "block") {
				return true
			}
		}
	case "blpop", "brpop", "blmove", "blmpop", "bzpopmin", "bzpopmax", "bzmpop":
		return true
	}
	return false
}
