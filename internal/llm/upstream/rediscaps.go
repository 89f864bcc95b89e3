package upstream

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/rediserr"
)

var (
	//go:embed caps_acquire.lua
	capsAcquireLua string
	//go:embed caps_release.lua
	capsReleaseLua string
	//go:embed caps_renew.lua
	capsRenewLua string

	capsAcquire = redis.NewScript(capsAcquireLua)
	capsRelease = redis.NewScript(capsReleaseLua)
	capsRenew   = redis.NewScript(capsRenewLua)
)

// Bounds on the Redis calls of the Redis implementations.
const (
	redisCallTimeout = 500 * time.Millisecond
	releaseTimeout   = 2 * time.Second
	fallbackProbe    = time.Second
	recheckEvery     = time.Second
)

// DefaultLeaseTTL is the default RedisConfig.LeaseTTL, the Redis pool's.
const DefaultLeaseTTL = 30 * time.Second

// RedisConfig configures RedisCaps.
type RedisConfig struct {
	// Prefix starts every key. Default "upstream:". No braces: the package
	// adds the hash tag.
	Prefix string
	// LeaseTTL is how long a slot outlives the last renewal of its process
	// (POOL_LEASE_TTL_SECONDS); renewal runs every LeaseTTL/3. Whole
	// milliseconds, at least 100ms. Default 30s.
	LeaseTTL time.Duration
	// Holder names this process in lease ids ("<holder>/<id>"). Optional.
	Holder string
}

func (c RedisConfig) withDefaults() RedisConfig {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	return c
}

// Validate reports whether c is usable. It does not change c.
func (c RedisConfig) Validate() error {
	d := c.withDefaults()
	var errs []error
	if strings.ContainsAny(d.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("Prefix %q contains a brace", d.Prefix))
	}
	if c.LeaseTTL < 0 || d.LeaseTTL < 100*time.Millisecond || d.LeaseTTL%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("LeaseTTL %s must be whole milliseconds, at least 100ms", c.LeaseTTL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("upstream: redis config: %w", err)
	}
	return nil
}

// RedisCaps are caps shared by every process on one Redis: a slot is a
// lease in the upstream's InFlightKey, scored by its expiry on the Redis
// clock, renewed by its process every LeaseTTL/3 in one script call for all
// upstreams, so a process that dies gives its slots back within LeaseTTL.
// Lease ids are never reused, so a late release frees no one else's slot.
//
// Load is fed by every script reply and by the counts each release
// publishes on CapsChannel, so routing reads it without a round trip.
//
// While Redis cannot be reached (a connection error or timeout, not an
// error reply) slots come from in-process LocalCaps with the same caps;
// Redis is tried again at most once a second, and each switch is logged.
// The cluster may then exceed a cap by the number of processes.
type RedisCaps struct {
	rdb   redis.UniversalClient
	cfg   RedisConfig
	specs []Spec
	limits
	keys   []string // InFlightKey per upstream
	byName map[string]int
	log    *slog.Logger

	idPrefix string
	seq      atomic.Uint64
	loads    []atomic.Int64
	change   notifier

	local     *LocalCaps
	degraded  atomic.Bool
	nextProbe atomic.Int64

	mu   sync.Mutex
	held map[string]int // lease id -> upstream index

	stop context.CancelFunc
	done sync.WaitGroup
}

var _ Caps = (*RedisCaps)(nil)

// NewRedisCaps returns caps for specs on rdb and starts the renewal and
// notification goroutines; Close stops them. rdb is never closed by it.
func NewRedisCaps(rdb redis.UniversalClient, specs []Spec, cfg RedisConfig, log *slog.Logger) (*RedisCaps, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil || log == nil {
		return nil, errors.New("upstream: redis caps need a client and a logger")
	}
	cfg = cfg.withDefaults()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	c := &RedisCaps{
		rdb: rdb, cfg: cfg, specs: specs, log: log, limits: newLimits(specs),
		keys:     make([]string, len(specs)),
		byName:   make(map[string]int, len(specs)),
		idPrefix: cfg.Holder + "/" + hex.EncodeToString(rnd[:]) + ":",
		loads:    make([]atomic.Int64, len(specs)),
		local:    NewLocalCaps(specs),
		held:     make(map[string]int),
	}
	for i, s := range specs {
		c.keys[i] = InFlightKey(cfg.Prefix, s.Name)
		c.byName[s.Name] = i
	}
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	sub := rdb.Subscribe(ctx, CapsChannel(cfg.Prefix))
	c.done.Add(2)
	go c.listen(ctx, sub)
	go c.renewLoop(ctx)
	return c, nil
}

// Close stops renewing and listening. Slots still held expire within
// LeaseTTL. Order: the listener first, then renewal, so no callback runs
// after Close returns.
func (c *RedisCaps) Close() error {
	c.stop()
	c.done.Wait()
	return nil
}

// TryAcquire takes a slot of upstream i in Redis, or in the local fallback
// while Redis is away.
func (c *RedisCaps) TryAcquire(ctx context.Context, i int) (Slot, error) {
	if err := ctx.Err(); err != nil {
		return Slot{}, err
	}
	if c.Limit(i) == 0 {
		// No cap: nothing to share (the Balancer does not ask).
		return c.local.TryAcquire(ctx, i)
	}
	if c.degraded.Load() {
		next := c.nextProbe.Load()
		now := time.Now().UnixNano()
		if now < next || !c.nextProbe.CompareAndSwap(next, now+int64(fallbackProbe)) {
			return c.local.TryAcquire(ctx, i)
		}
	}
	id := c.idPrefix + strconv.FormatUint(c.seq.Add(1), 36)
	cctx, cancel := context.WithTimeout(ctx, redisCallTimeout)
	defer cancel()
	res, err := capsAcquire.Run(cctx, c.rdb, []string{c.keys[i]},
		id, c.Limit(i), c.cfg.LeaseTTL.Milliseconds()).Int64Slice()
	if err != nil {
		if ctx.Err() != nil {
			return Slot{}, fmt.Errorf("upstream: acquire %s: %w", c.specs[i].Name, ctx.Err())
		}
		switch rediserr.Classify(err) {
		case rediserr.Fine:
			return Slot{}, fmt.Errorf("upstream: acquire %s: %w", c.specs[i].Name, err)
		case rediserr.Busy:
			// Slow, not gone: this call counts the replica as full (the
			// request spills to the queue or another upstream); the late
			// lease, if the script ran after all, expires by itself.
			return Slot{}, fmt.Errorf("upstream: acquire %s: Redis did not answer in time: %w (%w)", c.specs[i].Name, ErrFull, err)
		}
		c.setDegraded(true, err)
		return c.local.TryAcquire(ctx, i)
	}
	c.setDegraded(false, nil)
	if len(res) != 2 {
		return Slot{}, fmt.Errorf("upstream: acquire %s: unexpected reply %v", c.specs[i].Name, res)
	}
	c.loads[i].Store(res[1])
	if res[0] == 0 {
		return Slot{}, ErrFull
	}
	c.mu.Lock()
	c.held[id] = i
	c.mu.Unlock()
	return Slot{index: i, id: id}, nil
}

// Release gives s back: to Redis, which tells every process, or to the
// local fallback it came from.
func (c *RedisCaps) Release(s Slot) {
	if s.id == "" {
		c.local.Release(s)
		c.change.notify()
		return
	}
	c.mu.Lock()
	delete(c.held, s.id)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	res, err := capsRelease.Run(ctx, c.rdb, []string{c.keys[s.index]},
		s.id, CapsChannel(c.cfg.Prefix), c.specs[s.index].Name).Int64Slice()
	if err != nil || len(res) != 2 {
		// The lease expires on its own within LeaseTTL.
		c.log.Warn("upstream: release of a call slot failed; it expires with its lease",
			"upstream", c.specs[s.index].Name, "error", err)
		return
	}
	c.loads[s.index].Store(res[1])
}

// Load returns upstream i's cluster-wide calls in flight as last learnt,
// plus the local fallback's while Redis is away.
func (c *RedisCaps) Load(i int) int {
	if c.degraded.Load() {
		return c.local.Load(i)
	}
	return int(c.loads[i].Load())
}

// SetLimit makes upstream i's limit n (adaptive concurrency, whose limit
// is the same in every process), within 1 and its MaxConcurrency, here
// and in the local fallback; calls already in flight above it finish. A
// raised limit wakes waiters.
func (c *RedisCaps) SetLimit(i, n int) {
	c.local.SetLimit(i, n)
	if c.set(i, n) {
		c.change.notify()
	}
}

// Changed returns a channel closed at the next release anywhere or raised
// limit, and at least every second.
func (c *RedisCaps) Changed() <-chan struct{} { return c.change.wait() }

func (c *RedisCaps) setDegraded(on bool, err error) {
	if c.degraded.Swap(on) == on {
		return
	}
	if on {
		c.nextProbe.Store(time.Now().Add(fallbackProbe).UnixNano())
		c.log.Warn("upstream: Redis gone; upstream caps are counted per process until it returns", "error", err)
	} else {
		c.log.Info("upstream: Redis is back; upstream caps are cluster-wide again")
	}
	c.change.notify()
}

// listen reads release notices: "<count> <name>".
func (c *RedisCaps) listen(ctx context.Context, sub *redis.PubSub) {
	defer c.done.Done()
	defer sub.Close()
	msgs := sub.Channel()
	for {
		var msg *redis.Message
		select {
		case <-ctx.Done():
			return
		case msg = <-msgs:
		}
		count, name, ok := strings.Cut(msg.Payload, " ")
		n, err := strconv.ParseInt(count, 10, 64)
		i, known := c.byName[name]
		if ok && err == nil && known && n >= 0 {
			c.loads[i].Store(n)
		}
		c.change.notify()
	}
}

// renewLoop renews this process's slots every LeaseTTL/3 and wakes waiters
// every second for what Pub/Sub cannot report (expired leases, messages
// lost while reconnecting).
func (c *RedisCaps) renewLoop(ctx context.Context) {
	defer c.done.Done()
	renew := time.NewTicker(c.cfg.LeaseTTL / 3)
	defer renew.Stop()
	recheck := time.NewTicker(recheckEvery)
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recheck.C:
			c.change.notify()
		case <-renew.C:
			c.renew(ctx)
		}
	}
}

// renew is one renewal round: a single script call for every upstream.
func (c *RedisCaps) renew(ctx context.Context) {
	if c.degraded.Load() {
		return
	}
	c.mu.Lock()
	groups := make([][]string, len(c.specs))
	for id, i := range c.held {
		groups[i] = append(groups[i], id)
	}
	c.mu.Unlock()
	var keys []string
	var idx []int
	args := []any{c.cfg.LeaseTTL.Milliseconds()}
	for i, s := range c.specs {
		if s.MaxConcurrency > 0 {
			keys = append(keys, c.keys[i])
			idx = append(idx, i)
			args = append(args, len(groups[i]))
		}
	}
	if len(keys) == 0 {
		return
	}
	for _, i := range idx {
		for _, id := range groups[i] {
			args = append(args, id)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	v, err := capsRenew.Run(cctx, c.rdb, keys, args...).Slice()
	if err != nil || len(v) != 2 {
		if ctx.Err() == nil {
			c.log.Warn("upstream: renewal of call slots failed", "error", err)
		}
		return
	}
	counts, _ := v[0].([]any)
	for k, raw := range counts {
		if n, ok := raw.(int64); ok && k < len(idx) {
			c.loads[idx[k]].Store(n)
		}
	}
	lost, _ := v[1].([]any)
	if len(lost) > 0 {
		c.mu.Lock()
		for _, raw := range lost {
			if id, ok := raw.(string); ok {
				delete(c.held, id)
			}
		}
		c.mu.Unlock()
		c.log.Warn("upstream: call slots expired before renewal; a cap may be exceeded until they end",
			"count", len(lost))
	}
	c.change.notify()
}
