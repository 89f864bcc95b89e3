package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/spillway-dev/spillway/internal/failover"
)

// cancelWatch listens for clients that left (docs/QUEUE.md,
// "Cancellation") and cancels the jobs running for them.
type cancelWatch struct {
	watcher failover.CancelWatcher
	log     *slog.Logger

	mu   sync.Mutex
	jobs map[string]context.CancelCauseFunc // request id → cancel

	stream failover.CancelStream
	wg     sync.WaitGroup
}

func newCancelWatch(w failover.CancelWatcher, log *slog.Logger) *cancelWatch {
	return &cancelWatch{watcher: w, log: log, jobs: make(map[string]context.CancelCauseFunc)}
}

// start subscribes to announcements and listens on a goroutine terminate
// waits for.
func (c *cancelWatch) start(ctx context.Context) error {
	s, err := c.watcher.WatchCancels(ctx)
	if err != nil {
		return fmt.Errorf("worker: watch cancellations: %w", err)
	}
	c.stream = s
	c.wg.Go(func() {
		for id := range s.C() {
			c.mu.Lock()
			cancel := c.jobs[id]
			c.mu.Unlock()
			if cancel != nil {
				cancel(errClientGone)
			}
		}
	})
	return nil
}

// terminate closes the subscription and waits for the listener.
func (c *cancelWatch) terminate() {
	c.stream.Close()
	c.wg.Wait()
}

// track makes an announcement for requestID cancel; the returned func
// forgets it.
func (c *cancelWatch) track(requestID string, cancel context.CancelCauseFunc) (forget func()) {
	c.mu.Lock()
	c.jobs[requestID] = cancel
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.jobs, requestID)
		c.mu.Unlock()
	}
}
