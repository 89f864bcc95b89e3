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
)

// The window of Recent: six buckets of ten seconds, the current one
// included, so "the last minute" covers between 50 and 60 seconds.
const (
	recentBucket  = 10 * time.Second
	recentBuckets = 6
	// recentKeep is the TTL of the hash: a cluster that stops reporting
	// leaves nothing behind.
	recentKeep = 2 * time.Minute
	// recentStale is how long a read may keep failing before the cached
	// figures are dropped: old evidence of an incident must not hold a
	// degradation level up forever.
	recentStale = time.Minute
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
	calls, errors int64
	waits         [len(waitBounds) + 1]int64 // the last slot is beyond every bound
}

func (t *tally) empty() bool { return *t == tally{} }

// RecentKey is the hash Recent keeps its buckets in:
// "<prefix>degrade:recent".
func RecentKey(prefix string) string { return prefix + "degrade:recent" }

// Recent is the last minute of queue waits and provider call outcomes,
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
	rdb redis.Scripter
	key string
	log *slog.Logger

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
	calls     int64
}

// NewRecent returns a Recent on rdb (never closed by it) under prefix
// (QUEUE_PREFIX). log may be nil (slog.Default).
func NewRecent(prefix string, rdb redis.Scripter, log *slog.Logger) (*Recent, error) {
	if rdb == nil {
		return nil, errors.New("admission: recent needs a redis client")
	}
	if log == nil {
		log = slog.Default()
	}
	r := &Recent{rdb: rdb, key: RecentKey(prefix), log: log}
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

// ObserveCall counts one provider call, failed or not.
func (r *Recent) ObserveCall(failed bool) {
	r.mu.Lock()
	r.pending.calls++
	if failed {
		r.pending.errors++
	}
	r.mu.Unlock()
}

// QueueWaitP99 is the 99th percentile of the queue waits of the last
// minute, as last read (0 without any).
func (r *Recent) QueueWaitP99() time.Duration { return r.view.Load().waitP99 }

// ErrorRate is the share of the last minute's provider calls that failed,
// as last read (0 without any call).
func (r *Recent) ErrorRate() float64 { return r.view.Load().errorRate }

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
		if !r.lastRead.IsZero() && now.Sub(r.lastRead) > recentStale {
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
	args := []any{recentBucket.Milliseconds(), recentKeep.Milliseconds()}
	add := func(name string, n int64) {
		if n != 0 {
			args = append(args, name, n)
		}
	}
	add("calls", t.calls)
	add("errors", t.errors)
	for i, n := range t.waits {
		add("w"+strconv.Itoa(i), n)
	}
	if err := recentAdd.Run(ctx, r.rdb, []string{r.key}, args...).Err(); err != nil {
		r.mu.Lock()
		r.pending.calls += t.calls
		r.pending.errors += t.errors
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
	v, err := recentRead.Run(ctx, r.rdb, []string{r.key}, recentBucket.Milliseconds(), recentBuckets).Slice()
	if err != nil {
		return fmt.Errorf("admission: recent read %s: %w", r.key, err)
	}
	var sum tally
	for i := 0; i+1 < len(v); i += 2 {
		name, _ := v[i].(string)
		n, _ := v[i+1].(int64)
		switch {
		case name == "calls":
			sum.calls = n
		case name == "errors":
			sum.errors = n
		case len(name) > 1 && name[0] == 'w':
			if j, err := strconv.Atoi(name[1:]); err == nil && j >= 0 && j < len(sum.waits) {
				sum.waits[j] = n
			}
		}
	}
	view := &recentView{calls: sum.calls, waitP99: waitQuantile(sum.waits, 0.99)}
	if sum.calls > 0 {
		view.errorRate = float64(sum.errors) / float64(sum.calls)
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
