package app

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestRedisTimer: every command and pipeline of a real client is observed
// under its name; blocking reads are not.
func TestRedisTimer(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	c.AddHook(redisTimer{m.RedisCommand})
	ctx := t.Context()
	key := redistest.Prefix(t) + "k"
	if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, key)
		p.Get(ctx, key)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stream := redistest.Prefix(t) + "s"
	if err := c.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	_ = c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}, Block: 10e6}).Err()
	counts := map[string]uint64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "spillway_redis_command_seconds" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() == "op" {
					counts[l.GetValue()] += mm.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	for op, want := range map[string]uint64{"set": 1, "xgroup": 1, "xreadgroup": 0} {
		if counts[op] != want {
			t.Errorf("op %s observed %d times, want %d (all: %v)", op, counts[op], want, counts)
		}
	}
	// Connection set-up pipelines HELLO and CLIENT SETINFO too.
	if counts["pipeline"] < 1 {
		t.Errorf("pipeline not observed (all: %v)", counts)
	}
}
