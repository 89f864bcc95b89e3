package admission

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm"
)

// RecentWindow is the default window of Recent, "the last minute": twelve
// buckets of a twelfth of it each, the current one included, so it covers
// between eleven and twelve twelfths of the window. The latest two
// buckets (5 to 10 s of the default minute) tell whether failures go on
// now, so recovery shows within seconds rather than once the failures
// aged out of the minute.
const (
	RecentWindow  = time.Minute
	recentBuckets = 12
	recentLatest  = 2
	// recentTimeout bounds one flush or read.
	recentTimeout = 500 * time.Millisecond
)

// waitBounds are the upper bounds of the queue-wait histogram Recent
// keeps. The degradation thresholds (5, 15, 25 s) are bounds, so a p99 is
// on the right side of each exactly.
var waitBounds = [...]time.Duration{
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 15 * time.Second, 20 * time.Second, 25 * time.Second, 30 * time.Second,
	45 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
}

var (
	//go:embed recent_add.lua
	recentAddLua string
	//go:embed recent_read.lua
	recentReadLua string

	recentAdd  = redis.NewScript(recentAddLua)
	recentRead = redis.NewScript(recentReadLua)
)

// tally is counts since the last flush, or summed over the window.
type tally struct {
	ended, failed int64                      // requests
	waits         [len(waitBounds) + 1]int64 // the last slot is beyond every bound
}

func (t *tally) empty() bool { return *t == tally{} }

// RecentKey is the hash Recent keeps its buckets in:
// "<prefix>degrade:recent".
func RecentKey(prefix string) string { return prefix + "degrade:recent" }

// RecentConfig configures a Recent. Zero fields take their defaults.
type RecentConfig struct {
	// Prefix is QUEUE_PREFIX, under which the hash lives (RecentKey).
	Prefix string
	// Window is "the last minute": every process of a cluster must use
	// the same. Default RecentWindow (1 min); tests shorten it. The hash
	// is kept for two windows; a read that keeps failing for one window
	// drops the cached figures.
	Window time.Duration
}

// Recent is the last minute of queue waits and of requests' outcomes,
// cluster-wide: every api and consumer process adds what it saw to
// buckets in one Redis hash (time from Redis TIME), and the degradation
// level reads the sum (docs/OPERATIONS.md, "Degradation levels").
// Observations are counted in memory and flushed once a second, so the
// request path never waits on Redis; a flush that fails is kept and
// retried with the next one.
//
// Observe* and the readers are safe for concurrent use; Run must run once,
// in a goroutine its owner waits for.
type Recent struct {
	rdb    redis.Scripter
	key    string
	log    *slog.Logger
	bucket time.Duration // a twelfth of the window
	// keep is the TTL of the hash: a cluster that stops reporting leaves
	// nothing behind. stale is how long a read may keep failing before
	// the cached figures are dropped: old evidence of an incident must
	// not hold a degradation level up forever.
	keep, stale time.Duration

	mu      sync.Mutex
	pending tally

	view     atomic.Pointer[recentView]
	failing  bool      // inside a streak of failed reads (Run's goroutine)
	lastRead time.Time // last successful read (Run's goroutine)
}

// recentView is what the last read found.
type recentView struct {
	waitP99   time.Duration
	errorRate float64
	ended     int64
	// latestRate is errorRate over the latest buckets only.
	latestRate float64
}

// NewRecent returns a Recent on rdb (never closed by it). log may be nil
// (slog.Default).
func NewRecent(cfg RecentConfig, rdb redis.Scripter, log *slog.Logger) (*Recent, error) {
	if rdb == nil {
		return nil, errors.New("admission: recent needs a redis client")
	}
	if cfg.Window < 0 || (cfg.Window > 0 && cfg.Window < recentBuckets*time.Millisecond) {
		return nil, fmt.Errorf("admission: recent window %s must be at least %dms", cfg.Window, recentBuckets)
	}
	if cfg.Window == 0 {
		cfg.Window = RecentWindow
	}
	if log == nil {
		log = slog.Default()
	}
	r := &Recent{rdb: rdb, key: RecentKey(cfg.Prefix), log: log,
		bucket: cfg.Window / recentBuckets, keep: 2 * cfg.Window, stale: cfg.Window}
	r.view.Store(&recentView{})
	return r, nil
}

// ObserveWait counts one job's wait from enqueue to its pool slot.
func (r *Recent) ObserveWait(d time.Duration) {
	i := 0
	for i < len(waitBounds) && d > waitBounds[i] {
		i++
	}
	r.mu.Lock()
	r.pending.waits[i]++
	r.mu.Unlock()
}

// ObserveRequest counts one request as its client saw it, once, when it
// ended: err is the provider's last error after every retry and every
// other upstream, nil for a complete answer. RequestOutcome says whether
// it counts and whether as failed.
func (r *Recent) ObserveRequest(err error) {
	counts, failed := RequestOutcome(err)
	if !counts {
		return
	}
	r.mu.Lock()
	r.pending.ended++
	if failed {
		r.pending.failed++
	}
	r.mu.Unlock()
}

// RequestOutcome classifies how a request ended for the failure input of
// the degradation level (docs/OPERATIONS.md, "What does not degrade"): err
// is the provider's last error, nil for a complete answer, which counts as
// served, however many calls failed before it. It fails for a reason the
// provider owns: a timeout, a 5xx, a refused or cut connection, an
// unreadable answer, 401/403, or a circuit that stayed open. An upstream
// 429 is the adaptive limit's and the quotas' signal, and a cancel, a
// refusal of the request's own content (4xx), no upstream capacity or a
// failure to hand the answer on are not the provider's: those count
// neither way.
func RequestOutcome(err error) (counts, failed bool) {
	if err == nil {
		return true, false
	}
	if llm.IsCircuitOpen(err) {
		return true, true
	}
	if code, ok := llm.ResponseCode(err); ok && code == "429" {
		return false, false
	}
	if llm.IsClientError(err) || errors.Is(err, context.Canceled) {
		return false, false
	}
	if (llm.Call{Err: err}).Failed() {
		return true, true
	}
	return false, false
}

// QueueWaitP99 is the 99th percentile of the queue waits of the last
// minute, as last read (0 without any).
func (r *Recent) QueueWaitP99() time.Duration { return r.view.Load().waitP99 }

// ErrorRate is the share of the last minute's ended requests that failed,
// as last read (0 without any).
func (r *Recent) ErrorRate() float64 { return r.view.Load().errorRate }

// Requests is how many requests ended in the last minute, as last read.
func (r *Recent) Requests() int64 { return r.view.Load().ended }

// LatestErrorRate is ErrorRate over the latest two twelfths of the window
// only (5 to 10 s of the default minute), as last read; 0 when no request
// ended then.
func (r *Recent) LatestErrorRate() float64 { return r.view.Load().latestRate }

// Run flushes and reads once a second until ctx ends, then flushes what
// is left, bounded by recentTimeout.
func (r *Recent) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recentTimeout)
			_ = r.flush(fctx)
			cancel()
			return
		case now := <-t.C:
			r.Refresh(ctx, now)
		}
	}
}

// Refresh flushes this process's counts and reads the window once; Run
// calls it every second. now is the time of the call.
func (r *Recent) Refresh(ctx context.Context, now time.Time) {
	cctx, cancel := context.WithTimeout(ctx, recentTimeout)
	defer cancel()
	err := r.flush(cctx)
	if err == nil {
		err = r.read(cctx, now)
	}
	switch {
	case err != nil && ctx.Err() != nil:
	case err != nil:
		if !r.failing {
			r.failing = true
			r.log.Warn("degradation: cannot reach the last minute's figures in Redis; keeping the last ones", "err", err)
		}
		if !r.lastRead.IsZero() && now.Sub(r.lastRead) > r.stale {
			r.view.Store(&recentView{})
		}
	case r.failing:
		r.failing = false
		r.log.Info("degradation: the last minute's figures are readable again")
	}
}

// flush adds the pending counts to the current bucket; on failure they
// stay pending.
func (r *Recent) flush(ctx context.Context) error {
	r.mu.Lock()
	t := r.pending
	r.pending = tally{}
	r.mu.Unlock()
	if t.empty() {
		return nil
	}
	args := []any{r.bucket.Milliseconds(), r.keep.Milliseconds()}
	add := func(name string, n int64) {
		if n != 0 {
			args = append(args, name, n)
		}
	}
	add("ended", t.ended)
	add("failed", t.failed)
	for i, n := range t.waits {
		add("w"+strconv.Itoa(i), n)
	}
	if err := recentAdd.Run(ctx, r.rdb, []string{r.key}, args...).Err(); err != nil {
		r.mu.Lock()
		r.pending.ended += t.ended
		r.pending.failed += t.failed
		for i, n := range t.waits {
			r.pending.waits[i] += n
		}
		r.mu.Unlock()
		return fmt.Errorf("admission: recent add %s: %w", r.key, err)
	}
	return nil
}

// read sums the window and caches what it says.
func (r *Recent) read(ctx context.Context, now time.Time) error {
	v, err := recentRead.Run(ctx, r.rdb, []string{r.key}, r.bucket.Milliseconds(), recentBuckets, recentLatest).Slice()
	if err != nil {
		return fmt.Errorf("admission: recent read %s: %w", r.key, err)
	}
	var sum tally
	var latestEnded, latestFailed int64
	for i := 0; i+1 < len(v); i += 2 {
		name, _ := v[i].(string)
		n, _ := v[i+1].(int64)
		switch {
		case name == "ended":
			sum.ended = n
		case name == "failed":
			sum.failed = n
		case name == "r:ended":
			latestEnded = n
		case name == "r:failed":
			latestFailed = n
		case len(name) > 1 && name[0] == 'w':
			if j, err := strconv.Atoi(name[1:]); err == nil && j >= 0 && j < len(sum.waits) {
				sum.waits[j] = n
			}
		}
	}
	view := &recentView{ended: sum.ended, waitP99: waitQuantile(sum.waits, 0.99)}
	if sum.ended > 0 {
		view.errorRate = float64(sum.failed) / float64(sum.ended)
	}
	if latestEnded > 0 {
		view.latestRate = float64(latestFailed) / float64(latestEnded)
	}
	r.view.Store(view)
	r.lastRead = now
	return nil
}

// waitQuantile estimates quantile q of the histogram counts, interpolating
// within the bucket it falls in, as Prometheus's histogram_quantile does;
// beyond the last bound it answers that bound.
func waitQuantile(counts [len(waitBounds) + 1]int64, q float64) time.Duration {
	var total int64
	for _, n := range counts {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var below int64
	for i, n := range counts {
		if n == 0 || float64(below+n) < rank {
			below += n
			continue
		}
		if i == len(waitBounds) {
			return waitBounds[len(waitBounds)-1]
		}
		var lo time.Duration
		if i > 0 {
			lo = waitBounds[i-1]
		}
		frac := (rank - float64(below)) / float64(n)
		return lo + time.Duration(frac*float64(waitBounds[i]-lo))
	}
	return waitBounds[len(waitBounds)-1]
}
