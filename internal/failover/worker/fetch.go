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
// jobs behind one identity's backlog. Beside it runs the takeover loop
// (takeovers), when the consumer can take orphans over apart from Fetch.
type fetcher struct {
	cfg      Config
	consumer failover.Consumer
	log      *slog.Logger

	mu sync.Mutex
	// inflight holds the delivery ids this process is answering. A
	// delivery of one of them again means this process's own claim went
	// idle and it reclaimed it: the running answer goes on, and the copy
	// waits in again until it ends. If the running answer ends without
	// settling the job (fenced off: its claim was not refreshed in time,
	// a Redis pause), the copy runs; else it is dropped.
	inflight map[string]bool
	again    map[string]failover.Delivery
}

func newFetcher(cfg Config, c failover.Consumer, log *slog.Logger) *fetcher {
	return &fetcher{cfg: cfg, consumer: c, log: log, inflight: make(map[string]bool), again: make(map[string]failover.Delivery)}
}

// handler answers one delivery and reports whether it stopped on a lost
// claim, leaving the job unsettled.
type handler func(failover.Delivery) (claimLost bool)

// run fetches until ctx ends and starts handle for each delivery on a
// goroutine counted in jobs; the caller waits for them. It fetches only
// as many jobs as sched has room for.
func (f *fetcher) run(ctx context.Context, sched *scheduler, jobs *sync.WaitGroup, handle handler) {
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
		f.start(ds, sched, jobs, handle)
	}
}

// takeovers is the takeover loop (docs/QUEUE.md, "Takeover"): at once and
// then every ReclaimInterval until ctx ends, it takes over the jobs of
// dead members (claims idle for the reclaim time), whatever room the fetch
// loop has, as many as the scheduler may park, and starts them as run
// does; the scheduler gives them worker slots before newer jobs. Each
// sends its first heartbeat and its reset at once, so the clients hear of
// the takeover within the api's patience even when every slot is busy.
func (f *fetcher) takeovers(ctx context.Context, r failover.Reclaimer, sched *scheduler, jobs *sync.WaitGroup, handle handler) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n := sched.takeoverRoom(); n > 0 {
			ds, err := r.Reclaim(ctx, n)
			if err != nil && ctx.Err() == nil {
				f.log.Error("takeover of idle jobs failed", "err", err)
			}
			if len(ds) > 0 {
				f.log.Info("took over jobs of a dead worker", "jobs", len(ds))
			}
			f.start(ds, sched, jobs, handle)
		}
		t.Reset(r.ReclaimInterval())
	}
}

// start starts handle for each delivery of ds on a goroutine counted in
// jobs.
func (f *fetcher) start(ds []failover.Delivery, sched *scheduler, jobs *sync.WaitGroup, handle handler) {
	sched.took(len(ds))
	for _, d := range ds {
		if ok, replaced := f.claim(d); !ok {
			f.log.Warn("own job reclaimed while still running; keeping the running answer", "delivery", d.ID)
			if replaced {
				sched.finished() // an older copy, dropped
			}
			continue
		}
		f.goRun(d, sched, jobs, handle)
	}
}

func (f *fetcher) goRun(d failover.Delivery, sched *scheduler, jobs *sync.WaitGroup, handle handler) {
	jobs.Go(func() {
		lost := handle(d)
		next, ok := f.unclaim(d.ID, lost)
		sched.finished()
		if !ok {
			return
		}
		if !lost {
			sched.finished() // the copy: the job is settled
			return
		}
		f.log.Warn("own job reclaimed while its answer was fenced off; answering the reclaimed delivery", "delivery", d.ID)
		f.goRun(next, sched, jobs, handle)
	})
}

// claim marks delivery d as being answered here; false when it already
// is, and then d waits in again, replacing an older copy (replaced).
func (f *fetcher) claim(d failover.Delivery) (ok, replaced bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inflight[d.ID] {
		_, replaced = f.again[d.ID]
		f.again[d.ID] = d
		return false, replaced
	}
	f.inflight[d.ID] = true
	return true, false
}

// unclaim ends the answer to delivery id and returns the copy that
// arrived meanwhile, if any; when keep is set the id stays claimed for
// the copy.
func (f *fetcher) unclaim(id string, keep bool) (failover.Delivery, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.again[id]
	delete(f.again, id)
	if !ok || !keep {
		delete(f.inflight, id)
	}
	return d, ok
}
