package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
)

// fetcher is the fetch loop: it fetches as many jobs as the scheduler has
// room for and starts each on its own goroutine. Jobs parked behind their
// identity's per-user limit do not count against that room (up to
// MaxParked of them), which is what lets a worker reach other identities'
// jobs behind one identity's backlog.
type fetcher struct {
	cfg      Config
	consumer failover.Consumer
	log      *slog.Logger

	mu sync.Mutex
	// inflight holds the delivery ids this process is answering. A
	// delivery of one of them again means this process's own claim went
	// idle and it reclaimed it: the running answer goes on, the copy is
	// dropped.
	inflight map[string]bool
}

func newFetcher(cfg Config, c failover.Consumer, log *slog.Logger) *fetcher {
	return &fetcher{cfg: cfg, consumer: c, log: log, inflight: make(map[string]bool)}
}

// run fetches until ctx ends and starts handle for each delivery on a
// goroutine counted in jobs; the caller waits for them. It fetches only
// as many jobs as sched has room for.
func (f *fetcher) run(ctx context.Context, sched *scheduler, jobs *sync.WaitGroup, handle func(failover.Delivery)) {
	for ctx.Err() == nil {
		free := sched.room()
		if free == 0 {
			select {
			case <-sched.changed:
			case <-ctx.Done():
			}
			continue
		}
		ds, err := f.consumer.Fetch(ctx, free)
		if err != nil && ctx.Err() == nil {
			f.log.Error("fetch failed", "err", err)
			select { // back off a little so a dead backend is not hammered
			case <-time.After(f.cfg.baseDelay()):
			case <-ctx.Done():
			}
		}
		sched.took(len(ds))
		for _, d := range ds {
			if !f.claim(d.ID) {
				f.log.Warn("own job reclaimed while still running; keeping the running answer", "delivery", d.ID)
				sched.finished()
				continue
			}
			jobs.Go(func() {
				defer sched.finished()
				defer f.unclaim(d.ID)
				handle(d)
			})
		}
	}
}

// claim marks delivery id as being answered here; false when it already is.
func (f *fetcher) claim(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inflight[id] {
		return false
	}
	f.inflight[id] = true
	return true
}

func (f *fetcher) unclaim(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.inflight, id)
}
