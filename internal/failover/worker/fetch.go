package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
)

// fetcher is the fetch loop: it fetches as many jobs as there are free
// slots of Concurrency and starts each on its own goroutine.
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
// goroutine counted in jobs; the caller waits for them.
func (f *fetcher) run(ctx context.Context, jobs *sync.WaitGroup, handle func(failover.Delivery)) {
	slots := make(chan struct{}, f.cfg.Concurrency)
	for ctx.Err() == nil {
		// Wait for at least one free slot, then fetch as many jobs as are free.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		free := 1
	fill:
		for free < f.cfg.Concurrency {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break fill
			}
		}
		ds, err := f.consumer.Fetch(ctx, free)
		if err != nil && ctx.Err() == nil {
			f.log.Error("fetch failed", "err", err)
			select { // back off a little so a dead backend is not hammered
			case <-time.After(f.cfg.baseDelay()):
			case <-ctx.Done():
			}
		}
		for range free - len(ds) {
			<-slots
		}
		for _, d := range ds {
			if !f.claim(d.ID) {
				f.log.Warn("own job reclaimed while still running; keeping the running answer", "delivery", d.ID)
				<-slots
				continue
			}
			jobs.Go(func() {
				defer func() { <-slots }()
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
