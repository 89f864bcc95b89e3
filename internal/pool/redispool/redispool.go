// Package redispool owns the Redis-backed pool (POOL_BACKEND=redis): a
// distributed semaphore of expiring leases shared by every api and
// consumer process, the cross-process queue of waiting jobs that keeps them
// from being starved, and the local fallback used while Redis is away.
//
// Leases. A slot is a member of LeasesKey (and of the user's UserKey),
// scored by its expiry on the Redis clock. Each Pool renews every lease it
// holds, and its registered waiters, in one script call every LeaseTTL/3;
// a process that dies stops renewing, and its slots come back within
// LeaseTTL. A lease found expired at renewal is dropped and logged, never
// revived: its slot may already belong to someone else. Lease ids are never
// reused, so releasing a lease late frees no one else's slot.
//
// Fairness (docs/QUEUE.md, invariant 4: a freed slot goes to
// the oldest waiting job before any newer direct request). Acquire calls
// that have to wait register in WaitersKey, ordered by the Redis time of
// registration. A registered waiter is eligible while its user has a free
// per-user slot (of one user's waiters only as many as it has free slots
// count). With free = Size - live leases:
//   - a direct request (TryAcquire) is refused with ErrPoolExhausted while
//     the eligible waiters are at least as many as the free slots;
//   - a waiter is granted only when fewer than free eligible waiters come
//     before it (and its own user has room), in round-robin order between
//     users, FIFO within one: a waiter's turn is its user's live leases
//     plus its user's older waiters, so the user holding fewest slots goes
//     first, ties to the oldest (docs/QUEUE.md, "Fairness").
//
// So a waiter held back only by its own per-user limit never blocks
// anybody. Workers wait with AcquireOrDefer, which goes further: such a
// waiter is turned away with pool.ErrUserLimit and withdrawn, so the
// worker can give its slot to another identity's job (docs/QUEUE.md,
// "Fairness"). Within a process, one dispatcher goroutine tries its
// waiters, oldest first, all in one block.lua call a pass (wait.go), on
// every release anywhere in the cluster (block.lua and release.lua
// publish on NotifyChannel), and at the latest every second for what
// Pub/Sub cannot report (leases that expired, messages lost while
// reconnecting). Acquire with no local waiter first tries like a
// direct request, which succeeds only when no waiter is deprived.
//
// Slot blocks (block.go). Direct requests that need Redis, and releases,
// join the process's next block: one block.lua call carries every request
// and release that arrived while the previous call was out, so the pool's
// primary sees a call per block, not per stream. block.lua is the one
// script that grants slots, to waiters and direct requests alike: each
// rule above is written there once.
//
// Idle leases (idle.go). With Config.IdleHold a direct lease released by
// its holder (or a worker's, granted on its first try, not in line) stays
// a lease of this process for IdleHold, and the same user's next
// TryAcquire or first try here takes it without a Redis call; it is given
// back at once when a waiter joins the line, a direct request elsewhere is
// refused, or the adaptive limit falls (ReclaimChannel). Still a lease in
// Redis all along, it keeps both limits exact.
//
// Fallback. When Redis is gone (a connection refused or reset, or no
// answer to a health probe for DownAfter; a slow answer is not an outage,
// see health.go) the Pool serves from a local pool.Local of FallbackSize
// slots and PerUser, tells onFallback(true) and logs one line, then probes
// every second and returns to Redis on the first answer
// (onFallback(false), one line). Every Redis call has a short timeout, so
// no caller hangs on a Redis that stopped answering; a call that times out
// fails alone (a waiter tries again), except a slot block's, which waits
// for the health watch's verdict (block.go): a slow Redis is not a full
// pool. Leases
// from the fallback pool release to it; Redis leases released while in
// fallback (or whose release found Redis gone) are released in Redis by
// the renewal round that follows the return, so a failover does not keep
// their slots taken until they expire; leases held through an outage
// longer than LeaseTTL simply expire.
// Right after the return, slots still held in the fallback pools are not
// counted in Redis, so the cluster may briefly exceed Size by up to
// FallbackSize per process.
package redispool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/pool"
)

// Defaults applied to zero Config fields.
const (
	// DefaultPrefix is the default Config.Prefix.
	DefaultPrefix = "pool:"
	// DefaultLeaseTTL is the default Config.LeaseTTL
	// (POOL_LEASE_TTL_SECONDS=30).
	DefaultLeaseTTL = 30 * time.Second
	// DefaultFallbackSize is the default Config.FallbackSize
	// (POOL_LOCAL_FALLBACK_SIZE=10).
	DefaultFallbackSize = 10
)

// Bounds on Redis calls and background timers.
const (
	callTimeout    = 500 * time.Millisecond // acquire, leave, subscribe, probe
	releaseTimeout = 2 * time.Second        // Release and Close
	recheckEvery   = time.Second            // dispatcher's safety re-check
	probeEvery     = time.Second            // PING while in fallback
	statsMaxAge    = 500 * time.Millisecond // Stats refresh at most this often
	minLeaseTTL    = 100 * time.Millisecond
	minDownAfter   = 100 * time.Millisecond
)

// ErrClosed is wrapped by the errors of TryAcquire and Acquire after Close.
var ErrClosed = errors.New("redispool: pool closed")

// Config configures a Pool. Zero fields take the stated defaults. Every
// process sharing a Prefix must be given the same Size, PerUser and
// LeaseTTL.
type Config struct {
	// Prefix starts every key and the channel. Default "pool:". It must not
	// contain "{" or "}": the package adds the {pool} hash tag itself.
	Prefix string
	// Size is the number of global slots (CONNECTION_POOL_SIZE). At least 1.
	Size int
	// PerUser is the number of slots one user may hold
	// (CONNECTION_POOL_PER_USER), in Redis and in the fallback pool. At
	// least 1.
	PerUser int
	// LeaseTTL is how long a lease, or a registered waiter, outlives the
	// last renewal of its process (POOL_LEASE_TTL_SECONDS); renewal runs
	// every LeaseTTL/3. Whole milliseconds, at least 100ms. Default 30s.
	LeaseTTL time.Duration
	// FallbackSize is the global slot count of the local pool used while
	// Redis is unreachable (POOL_LOCAL_FALLBACK_SIZE). Default 10.
	FallbackSize int
	// Holder names this process in lease ids ("<holder>/<id>"), so
	// ZRANGE on LeasesKey shows who holds what. Optional.
	Holder string
	// AdaptiveLimit, when set, names the adaptive limit (LimitKey) that
	// lowers Size for every process sharing Prefix
	// (ADAPTIVE_CONCURRENCY); an adaptive.Controller keeps it through the
	// Pool's Report. Empty: Size alone. It must not contain a brace.
	AdaptiveLimit string
	// DownAfter is how long the health probe may go unanswered, counted
	// from a call that timed out, before Redis counts as gone
	// (REDIS_DOWN_AFTER_MS). Default 3s, at least 100ms.
	DownAfter time.Duration
	// Probe is the health probe: a PING on a connection of its own, so a
	// client pool full of slow calls does not make Redis look dead.
	// Optional: nil PINGs through the Pool's client.
	Probe func(context.Context) error
	// IdleHold is how long a direct lease released by its holder (or a
	// worker's not granted in line) stays a lease of this process, idle,
	// for the next acquire of the same user to take without a Redis call
	// (idle.go; docs/OPERATIONS.md,
	// "Idle leases"). 0 turns the cache off: every release goes to Redis
	// at once. The app gives DefaultIdleHold.
	IdleHold time.Duration
}

// Validate reports whether cfg is usable, each field out of range as a
// *bounds.Error. It checks the fields as given: New fills the zero fields
// that have a default before it calls Validate. It does not change cfg.
func (cfg Config) Validate() error {
	errs := []error{
		bounds.AtLeast("Size", cfg.Size, 1),
		bounds.AtLeast("PerUser", cfg.PerUser, 1),
		bounds.AtLeast("LeaseTTL", cfg.LeaseTTL, minLeaseTTL),
		bounds.AtLeast("FallbackSize", cfg.FallbackSize, 1),
		bounds.AtLeast("IdleHold", cfg.IdleHold, 0),
		bounds.AtLeast("DownAfter", cfg.DownAfter, minDownAfter),
	}
	if strings.ContainsAny(cfg.Prefix, "{}") {
		errs = append(errs, fmt.Errorf("Prefix %q contains a brace (the {pool} hash tag is added by the package)", cfg.Prefix))
	}
	if strings.ContainsAny(cfg.AdaptiveLimit, "{}") {
		errs = append(errs, fmt.Errorf("AdaptiveLimit %q contains a brace", cfg.AdaptiveLimit))
	}
	if cfg.LeaseTTL%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("LeaseTTL %s is not whole milliseconds", cfg.LeaseTTL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redispool: config: %w", err)
	}
	return nil
}

func (cfg Config) withDefaults() Config {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.FallbackSize == 0 {
		cfg.FallbackSize = DefaultFallbackSize
	}
	if cfg.DownAfter == 0 {
		cfg.DownAfter = DefaultDownAfter
	}
	return cfg
}

// Pool is the distributed pool. It is safe for concurrent use. Background
// goroutines start with the first call that needs them: the renewal loop
// (leases, waiters, cached Stats), the dispatcher with its Pub/Sub
// subscription (first Acquire that waits), the reclaimer of idle leases
// with its own (first TryAcquire, with IdleHold) and the probe (while in
// fallback). Close stops them.
type Pool struct {
	cfg        Config
	rdb        redis.UniversalClient
	prober     redis.UniversalClient // the default health probe's client (health.go)
	closeProbe func()
	log        *slog.Logger
	onFallback func(bool)
	local      *pool.Local

	leasesKey, waitersKey, waiterExpKey, userPrefix, channel string
	limitKey                                                 string // the adaptive limit's, "" without one
	reclaim                                                  string // ReclaimChannel
	ttlMS                                                    int64

	// reclaimGen counts "waiting" messages and new subscriptions to
	// ReclaimChannel: a reply that shows no waiter ends busy only if none
	// came since its call started (idle.go).
	reclaimGen atomic.Uint64

	// Timers; tests change them before first use.
	recheck    time.Duration
	probeEvery time.Duration

	closing chan struct{}  // closed by Close
	wg      sync.WaitGroup // background goroutines
	calls   sync.WaitGroup // script calls, abandoned ones included (trackCall)

	mu           sync.Mutex
	closed       bool
	held         map[string]string // lease id → user: the Redis leases to renew
	waiters      []*waiter         // this process's waiters, in arrival order
	orphans      []string          // waiter entries to withdraw once Redis is back
	seq          uint64
	callsDrained bool // Close waits on calls: count no more
	renewing     bool
	dispatching  bool
	suspecting   bool              // the health watch runs (health.go)
	slowSince    time.Time         // when the call that started it timed out
	verdict      chan struct{}     // closed at the watch's first verdict
	unreleased   map[string]string // lease id → user: releases that timed out or found Redis gone, retried by renewal
	renewedAt    time.Time         // when the last renewal round that succeeded started

	// Idle leases (idle.go); the leases are in held too.
	idle       map[string][]idleLease // user → its idle leases, most recent last
	idleCount  int
	reclaiming bool                // the reclaimer runs
	subscribed bool                // its subscription to ReclaimChannel is confirmed
	busy       bool                // waiters may be in line: keep nothing idle
	flushAll   bool                // give every idle lease back now
	flushUsers map[string]struct{} // give these users' idle leases back now

	// Spare leases (spare.go).
	active       map[string]int    // user → its direct leases held by callers here
	demand       map[string]demand // user → the most it held at once, lately
	demandPruned time.Time         // when demand's stale entries were last dropped
	slowBlocks   atomic.Bool       // the last block call took over spareMaxCall (spare.go)
	spareMaxCall atomic.Int64      // nanoseconds; defaultSpareMaxCall

	// Slot blocks (block.go): requests and releases for the next call.
	blockReqs []*blockReq
	blockRels []blockRel
	blocking  bool          // the block goroutine runs
	blockKick chan struct{} // cap 1: send what waits

	kick        chan struct{} // cap 1: run a dispatcher pass
	reclaimKick chan struct{} // cap 1: run the reclaimer's sweep
	statsKick   chan struct{} // cap 1: refresh the cached stats now

	statsMu sync.Mutex
	inUse   int
	limit   int // the size block.lua last applied (the adaptive limit)
	statsAt time.Time

	transMu  sync.Mutex // serializes transitions and their callback
	modeMu   sync.Mutex
	fallback bool
	changed  chan struct{} // closed at the next transition
}

var (
	_ pool.Pool     = (*Pool)(nil)
	_ pool.Queued   = (*Pool)(nil)
	_ pool.Deferrer = (*Pool)(nil)
)

// New returns a Pool on client. It does no I/O and starts no goroutine;
// it never closes client. log may be nil (slog.Default). onFallback, if
// not nil, is called on each switch to the fallback pool (true) and back
// (false), synchronously and in order; it must not block.
func New(cfg Config, client redis.UniversalClient, log *slog.Logger, onFallback func(bool)) (*Pool, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("redispool: nil redis client")
	}
	if log == nil {
		log = slog.Default()
	}
	local, err := pool.NewLocal(cfg.FallbackSize, cfg.PerUser)
	if err != nil {
		return nil, fmt.Errorf("redispool: fallback pool: %w", err)
	}
	prober, closeProbe := client, func() {}
	if cfg.Probe == nil {
		prober, closeProbe = newProber(client)
	}
	p := &Pool{
		cfg:          cfg,
		rdb:          client,
		prober:       prober,
		closeProbe:   closeProbe,
		log:          log,
		onFallback:   onFallback,
		local:        local,
		leasesKey:    LeasesKey(cfg.Prefix),
		waitersKey:   WaitersKey(cfg.Prefix),
		waiterExpKey: WaiterExpiryKey(cfg.Prefix),
		userPrefix:   userKeyPrefix(cfg.Prefix),
		channel:      NotifyChannel(cfg.Prefix),
		reclaim:      ReclaimChannel(cfg.Prefix),
		limitKey:     limitKeyOf(cfg),
		ttlMS:        cfg.LeaseTTL.Milliseconds(),
		recheck:      recheckEvery,
		probeEvery:   probeEvery,
		closing:      make(chan struct{}),
		held:         make(map[string]string),
		kick:         make(chan struct{}, 1),
		reclaimKick:  make(chan struct{}, 1),
		blockKick:    make(chan struct{}, 1),
		busy:         true, // until a reply shows the line empty
		statsKick:    make(chan struct{}, 1),
		changed:      make(chan struct{}),
		limit:        cfg.Size,
	}
	p.spareMaxCall.Store(int64(defaultSpareMaxCall))
	return p, nil
}

func limitKeyOf(cfg Config) string {
	if cfg.AdaptiveLimit == "" {
		return ""
	}
	return LimitKey(cfg.Prefix, cfg.AdaptiveLimit)
}

// TryAcquire takes a slot for user without waiting for one to free: an
// idle lease of user kept by this process (no Redis call, idle.go), else
// a place in the process's next slot block, one script call for every
// request that arrived meanwhile (block.go), or the fallback pool. A slow
// Redis is waited for, not taken for a full pool: until the block's reply,
// or until the health watch judges Redis gone and the fallback pool
// serves the request. It returns an error wrapping pool.ErrPoolExhausted
// (also when the free slots belong to older waiting jobs, or Redis stayed
// silent while its probe answered) or pool.ErrUserLimit, ctx's error, or
// ErrClosed.
func (p *Pool) TryAcquire(ctx context.Context, user string) (pool.Lease, error) {
	user = identity.Bucket(user)
	if p.isClosed() {
		return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ErrClosed)
	}
	if fb, _ := p.mode(); fb {
		return p.local.TryAcquire(ctx, user)
	}
	if p.cfg.IdleHold > 0 && ctx.Err() == nil {
		if l := p.takeIdle(user); l != nil {
			return l, nil
		}
	}
	l, err := p.acquireBlock(ctx, user)
	var ue *unavailableError
	var se *slowError
	switch {
	case errors.As(err, &ue):
		p.setFallback(true, err)
		return p.local.TryAcquire(ctx, user)
	case errors.As(err, &se):
		// Busy, not gone: this request goes to the queue, Redis keeps
		// serving the others (health.go). Unless the probe finds Redis
		// gone right away.
		p.awaitVerdict(ctx, p.suspect(err))
		if fb, _ := p.mode(); fb {
			return p.local.TryAcquire(ctx, user)
		}
		return nil, fmt.Errorf("redispool: acquire for %s: Redis did not answer in time: %w (%w)", user, pool.ErrPoolExhausted, err)
	}
	return l, err
}

// Acquire waits for a slot for user until ctx ends, FIFO among this
// process's waiters and, across processes, by the fairness rule in the
// package doc. On a switch to or from the fallback pool a waiter moves
// over and waits there. The error wraps ctx's error, ErrClosed, or an
// unexpected error reply from Redis.
func (p *Pool) Acquire(ctx context.Context, user string) (pool.Lease, error) {
	return p.AcquireSince(ctx, user, time.Now())
}

// AcquireSince is Acquire with the waiter placed in line, cluster-wide, by
// since (when its work was queued) instead of by when it called.
func (p *Pool) AcquireSince(ctx context.Context, user string, since time.Time) (pool.Lease, error) {
	return p.acquire(ctx, user, since, false)
}

// AcquireOrDefer is AcquireSince that waits only for a global slot: while
// user is at its per-user limit, at the call or later while it waits, it
// returns an error wrapping pool.ErrUserLimit and leaves the line, so a
// job that cannot start holds neither a worker nor a place that counts
// (docs/QUEUE.md, "Fairness").
func (p *Pool) AcquireOrDefer(ctx context.Context, user string, since time.Time) (pool.Lease, error) {
	return p.acquire(ctx, user, since, true)
}

func (p *Pool) acquire(ctx context.Context, user string, since time.Time, deferring bool) (pool.Lease, error) {
	user = identity.Bucket(user)
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("redispool: acquire for %s: %w", user, err)
		}
		if p.isClosed() {
			return nil, fmt.Errorf("redispool: acquire for %s: %w", user, ErrClosed)
		}
		fb, changed := p.mode()
		var l pool.Lease
		var err error
		if fb {
			l, err = p.acquireLocal(ctx, user, since, deferring, changed)
		} else {
			l, err = p.acquireRedis(ctx, user, since.UnixMicro(), deferring, changed)
		}
		if !errors.Is(err, errModeChanged) {
			return l, err
		}
	}
}

// Stats returns the cluster-wide slots in use, Size and the adaptive
// limit applied, from a cache that script calls keep current and that is
// refreshed in the background when older than 500ms: Stats itself never
// waits on Redis. While in fallback it returns the fallback pool's stats.
func (p *Pool) Stats() pool.Stats {
	if fb, _ := p.mode(); fb {
		return p.local.Stats()
	}
	p.statsMu.Lock()
	inUse, limit, at := p.inUse, p.limit, p.statsAt
	p.statsMu.Unlock()
	if time.Since(at) > statsMaxAge {
		p.mu.Lock()
		p.startRenewalLocked()
		p.mu.Unlock()
		p.kickRenew()
	}
	return pool.Stats{InUse: inUse, Capacity: p.cfg.Size, Limit: limit}
}

// Fallback reports whether the Pool currently serves from the local
// fallback pool because Redis is unreachable.
func (p *Pool) Fallback() bool {
	fb, _ := p.mode()
	return fb
}

// Close stops the Pool: later calls fail with ErrClosed, waiting Acquire
// calls return ErrClosed, the background goroutines (dispatcher and its
// subscription, renewal, reclaimer, probe) end, and the leases (idle ones
// included, in batches of one script call) and waiter entries still held
// in Redis are removed, best effort within 2s. It does not
// close the client and is safe to call more than once. Leases released
// after Close are no-ops.
func (p *Pool) Close() {
	if !p.stop() {
		return
	}
	defer p.closeProbe() // no goroutine probes any more
	// The goroutines are gone; what they held is ours to clean up.
	p.mu.Lock()
	held := p.held
	for id, user := range p.unreleased {
		held[id] = user
	}
	p.held, p.unreleased = make(map[string]string), nil
	p.idle, p.idleCount = nil, 0
	var members []string
	for _, w := range p.waiters {
		w.gone = true
		if w.registered {
			members = append(members, w.member)
		}
	}
	p.waiters = nil
	p.mu.Unlock()
	if fb, _ := p.mode(); fb || (len(held) == 0 && len(members) == 0) {
		p.drainCalls()
		return
	}
	// Shutdown order: goroutines first (nothing new is held), then the
	// leases and waiters, then the script calls that may still be running.
	defer p.drainCalls()
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	ids := make([]string, 0, len(held))
	users := make([]string, 0, len(held))
	for id, user := range held {
		ids, users = append(ids, id), append(users, user)
	}
	for len(ids) > 0 {
		n := min(len(ids), releaseBatch)
		if _, err := p.runRelease(ctx, ids[:n], users[:n]); err != nil {
			return
		}
		ids, users = ids[n:], users[n:]
	}
	for _, m := range members {
		if err := p.runLeave(ctx, m); err != nil {
			return
		}
	}
}

func (p *Pool) drainCalls() {
	p.mu.Lock()
	p.callsDrained = true
	p.mu.Unlock()
	p.calls.Wait()
}

// stop ends the background goroutines without touching Redis; it reports
// whether this call did it. Tests call it alone to play a crashed process.
func (p *Pool) stop() bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	p.closed = true
	close(p.closing)
	p.mu.Unlock()
	p.wg.Wait()
	return true
}

func (p *Pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// goLocked runs f in a goroutine owned by the Pool, unless it is closed.
func (p *Pool) goLocked(f func()) bool {
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
	return true
}

func (p *Pool) startRenewalLocked() {
	if !p.renewing {
		p.renewing = p.goLocked(p.renewLoop)
	}
}

// grantLocked records a lease granted in Redis so that it is renewed.
func (p *Pool) grantLocked(id, user string) *lease {
	p.held[id] = user
	p.startRenewalLocked()
	return &lease{p: p, id: id, user: user}
}

func (p *Pool) newLeaseID() string {
	if p.cfg.Holder == "" {
		return newID()
	}
	return p.cfg.Holder + "/" + newID()
}

// newID returns 16 hex characters; waiter members rely on the length.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}

func (p *Pool) setStats(inUse int) {
	p.statsMu.Lock()
	p.inUse, p.statsAt = inUse, time.Now()
	p.statsMu.Unlock()
}

// setLimit caches the size block.lua applied, or the adaptive limit a
// report returned.
func (p *Pool) setLimit(limit int) {
	p.statsMu.Lock()
	p.limit = min(limit, p.cfg.Size)
	p.statsMu.Unlock()
}

// lease is a slot in Redis. A lease taken from the idle cache is a new
// lease value for the same id, so a late second Release of its previous
// holder does nothing.
type lease struct {
	p        *Pool
	id, user string
	direct   bool      // granted to a direct attempt (acquireBlock, the cache): may be kept idle when released
	granted  time.Time // when the acquire that granted the id started
	once     sync.Once
}

// Release gives the slot back; only the first call does anything.
func (l *lease) Release() { l.once.Do(func() { l.p.release(l) }) }

func (p *Pool) release(l *lease) {
	id, user := l.id, l.user
	p.mu.Lock()
	_, mine := p.held[id]
	if l.direct {
		p.releasedDirectLocked(user)
	}
	if mine && l.direct && p.putIdleLocked(id, user, l.granted) {
		p.mu.Unlock()
		return
	}
	delete(p.held, id)
	p.mu.Unlock()
	// Not held any more: Close released it, or renewal found it expired.
	// In fallback Redis is not asked now; the renewal round after the
	// return does, unless the lease expired by then.
	if !mine {
		return
	}
	if fb, _ := p.mode(); fb {
		p.releaseLater(id, user)
		return
	}
	p.releaseBlock(id, user)
}

// releaseLater files a release for the next renewal round: a lease held
// through a fallback, a release that timed out, or a lease a timed-out
// acquire may have granted (forget).
func (p *Pool) releaseLater(id, user string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLaterLocked(id, user)
}

func (p *Pool) releaseLaterLocked(id, user string) {
	if p.closed {
		return
	}
	if p.unreleased == nil {
		p.unreleased = make(map[string]string)
	}
	p.unreleased[id] = user
}
