package upstream

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed health_fail.lua
	healthFailLua string
	//go:embed health_succeed.lua
	healthSucceedLua string

	healthFail    = redis.NewScript(healthFailLua)
	healthSucceed = redis.NewScript(healthSucceedLua)
)

// healthRefresh is how often every process reads all upstreams' health in
// one pipeline, for what Pub/Sub cannot tell (a cooldown running out,
// messages lost while reconnecting).
const healthRefresh = time.Second

// RedisHealth is Health shared by every process on one Redis: the keys of
// keys.go with TTLs, changed by small scripts, each change published on
// HealthChannel. Each process keeps a copy of every upstream's state,
// refreshed at every notice and every second, so State never waits on
// Redis. Consecutive failures are counted cluster-wide; a success resets
// the count with a Redis call only when this process has seen failures
// counted, so the common successful call costs no round trip.
//
// When Redis cannot be reached the copy stays as last read and failures
// are not counted: health fails open, and the caps and the queue still
// protect the replicas.
type RedisHealth struct {
	rdb    redis.UniversalClient
	cfg    HealthConfig
	prefix string
	specs  []Spec
	log    *slog.Logger
	byName map[string]int

	ups    []redisHealthState
	change notifier

	stop context.CancelFunc
	done sync.WaitGroup
}

type redisHealthState struct {
	downUntil atomic.Int64 // Unix ns, local clock
	suspect   atomic.Bool
	fails     atomic.Int64
	trialNext atomic.Int64 // Unix ns before which this process does not claim again
}

var _ Health = (*RedisHealth)(nil)
var _ ProbeLocker = (*RedisHealth)(nil)

// NewRedisHealth returns health for specs on rdb, reads the current state
// once and starts the refresh goroutine; Close stops it. prefix "" means
// DefaultPrefix. rdb is never closed by it.
func NewRedisHealth(rdb redis.UniversalClient, specs []Spec, prefix string, cfg HealthConfig, log *slog.Logger) (*RedisHealth, error) {
	if rdb == nil || log == nil {
		return nil, errors.New("upstream: redis health needs a client and a logger")
	}
	if err := (RedisConfig{Prefix: prefix}).Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	h := &RedisHealth{
		rdb: rdb, cfg: cfg, prefix: prefix, specs: specs, log: log,
		byName: make(map[string]int, len(specs)),
		ups:    make([]redisHealthState, len(specs)),
	}
	for i, s := range specs {
		h.byName[s.Name] = i
	}
	ctx, stop := context.WithCancel(context.Background())
	h.stop = stop
	h.refresh(ctx)
	sub := rdb.Subscribe(ctx, HealthChannel(prefix))
	h.done.Add(1)
	go h.loop(ctx, sub)
	return h, nil
}

// Close stops the refresh goroutine.
func (h *RedisHealth) Close() error {
	h.stop()
	h.done.Wait()
	return nil
}

func (h *RedisHealth) keys(i int) []string {
	n := h.specs[i].Name
	return []string{FailsKey(h.prefix, n), DownKey(h.prefix, n), SuspectKey(h.prefix, n), TrialKey(h.prefix, n)}
}

// State returns upstream i's state from this process's copy.
func (h *RedisHealth) State(i int) State {
	u := &h.ups[i]
	switch {
	case time.Now().UnixNano() < u.downUntil.Load():
		return Ejected
	case u.suspect.Load():
		return Trial
	}
	return Healthy
}

// ClaimTrial takes upstream i's trial key (SET NX, for Cooldown). A
// process that loses does not ask again for a second.
func (h *RedisHealth) ClaimTrial(ctx context.Context, i int) bool {
	u := &h.ups[i]
	now := time.Now()
	if h.State(i) != Trial || now.UnixNano() < u.trialNext.Load() {
		return false
	}
	u.trialNext.Store(now.Add(trialRetry).UnixNano())
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	defer cancel()
	ok, err := h.rdb.SetNX(cctx, TrialKey(h.prefix, h.specs[i].Name), "1", h.cfg.Cooldown).Result()
	return err == nil && ok
}

// Failed runs health_fail.lua for upstream i.
func (h *RedisHealth) Failed(ctx context.Context, i int, f Failure) (bool, error) {
	trial := "0"
	if f.Trial {
		trial = "1"
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisCallTimeout)
	defer cancel()
	res, err := healthFail.Run(cctx, h.rdb, h.keys(i),
		h.cfg.MaxFails, h.cfg.Cooldown.Milliseconds(), f.SitOut.Milliseconds(), trial, f.Reason,
		HealthChannel(h.prefix), h.specs[i].Name).Int64Slice()
	if err != nil || len(res) != 2 {
		return false, fmt.Errorf("upstream: record failure of %s: %w", h.specs[i].Name, errors.Join(err, errReply(res)))
	}
	u := &h.ups[i]
	u.fails.Store(res[1])
	if res[0] == 1 {
		sitOut := f.SitOut
		if sitOut <= 0 {
			sitOut = h.cfg.Cooldown
		}
		u.downUntil.Store(time.Now().Add(sitOut).UnixNano())
		u.suspect.Store(true)
		h.change.notify()
		return true, nil
	}
	return false, nil
}

// Succeeded runs health_succeed.lua for upstream i when there is something
// to clear; otherwise it does nothing.
func (h *RedisHealth) Succeeded(ctx context.Context, i int) (bool, error) {
	u := &h.ups[i]
	if u.fails.Load() == 0 && h.State(i) != Trial {
		return false, nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisCallTimeout)
	defer cancel()
	back, err := healthSucceed.Run(cctx, h.rdb, h.keys(i), HealthChannel(h.prefix), h.specs[i].Name).Int64()
	if err != nil {
		return false, fmt.Errorf("upstream: record success of %s: %w", h.specs[i].Name, err)
	}
	u.fails.Store(0)
	if back == 1 {
		u.suspect.Store(false)
		u.downUntil.Store(0)
		h.change.notify()
		return true, nil
	}
	return false, nil
}

// Changed returns a channel closed at the next change seen by this process.
func (h *RedisHealth) Changed() <-chan struct{} { return h.change.wait() }

// TryProbeLock lets one process per every run the active probe.
func (h *RedisHealth) TryProbeLock(ctx context.Context, every time.Duration) bool {
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	defer cancel()
	ok, err := h.rdb.SetNX(cctx, ProbeLockKey(h.prefix), "1", every).Result()
	return err == nil && ok
}

func (h *RedisHealth) loop(ctx context.Context, sub *redis.PubSub) {
	defer h.done.Done()
	defer sub.Close()
	t := time.NewTicker(healthRefresh)
	defer t.Stop()
	msgs := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case <-msgs:
		case <-t.C:
		}
		h.refresh(ctx)
	}
}

// refresh reads every upstream's keys in one pipeline.
func (h *RedisHealth) refresh(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	defer cancel()
	pipe := h.rdb.Pipeline()
	ttls := make([]*redis.DurationCmd, len(h.specs))
	sus := make([]*redis.IntCmd, len(h.specs))
	fails := make([]*redis.StringCmd, len(h.specs))
	for i, s := range h.specs {
		ttls[i] = pipe.PTTL(cctx, DownKey(h.prefix, s.Name))
		sus[i] = pipe.Exists(cctx, SuspectKey(h.prefix, s.Name))
		fails[i] = pipe.Get(cctx, FailsKey(h.prefix, s.Name))
	}
	if _, err := pipe.Exec(cctx); err != nil && !errors.Is(err, redis.Nil) {
		return // keep the last copy; fail open
	}
	now := time.Now()
	changed := false
	for i := range h.specs {
		u := &h.ups[i]
		var until int64
		if d := ttls[i].Val(); d > 0 {
			until = now.Add(d).UnixNano()
		}
		wasDown := now.UnixNano() < u.downUntil.Load()
		u.downUntil.Store(until)
		s := sus[i].Val() == 1
		if u.suspect.Swap(s) != s || wasDown != (until > 0) {
			changed = true
		}
		n, _ := fails[i].Int64()
		u.fails.Store(n)
	}
	if changed {
		h.change.notify()
	}
}

func errReply(res []int64) error {
	if res != nil && len(res) != 2 {
		return fmt.Errorf("unexpected reply %v", res)
	}
	return nil
}
