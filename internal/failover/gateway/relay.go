package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// relay turns one subscription into decoded results and watches the
// worker's liveness. Its goroutine is owned by Close, which waits for it.
type relay struct {
	g       *Gateway
	job     protocol.Job
	sub     failover.ResultSubscription
	results chan protocol.Result
	done    chan struct{} // closed when the relay gave up; problem says why
	stop    chan struct{} // closed by Close
	problem *protocol.Problem
	wg      sync.WaitGroup
	once    sync.Once
}

func startRelay(g *Gateway, job protocol.Job, sub failover.ResultSubscription) *relay {
	r := &relay{g: g, job: job, sub: sub, results: make(chan protocol.Result, g.cfg.Buffer),
		done: make(chan struct{}), stop: make(chan struct{})}
	r.wg.Go(r.run)
	return r
}

func (r *relay) Results() <-chan protocol.Result { return r.results }
func (r *relay) Done() <-chan struct{}           { return r.done }

// Problem is only read after Done is closed, which orders it after the
// write in giveUp.
func (r *relay) Problem() *protocol.Problem { return r.problem }

func (r *relay) giveUp(p *protocol.Problem) {
	r.problem = p
	close(r.done)
}

// silence is how long a started job's worker may stay quiet before the
// relay gives up: three missed heartbeats, then a takeover window of
// ReclaimIdle plus three heartbeats (docs/QUEUE.md, "Liveness").
func (c Config) silence() time.Duration {
	return 3*c.WorkerHeartbeat + c.ReclaimIdle + 3*c.WorkerHeartbeat
}

func (r *relay) run() {
	g, cfg := r.g, r.g.cfg
	// Before a worker speaks, only the queue timeout applies; after, the
	// silence limit.
	silence := cfg.silence()
	watchdog := time.NewTimer(time.Until(r.job.Deadline))
	defer watchdog.Stop()
	started := false
	subC := r.sub.C()
	for {
		select {
		case msg, ok := <-subC:
			if !ok { // the subscription ended: Done is closed and says why
				subC = nil
				continue
			}
			res, err := protocol.DecodeResult(msg)
			if err != nil {
				g.deps.Metrics.MalformedMessage("result_channel")
				g.deps.Log.Warn("malformed result message skipped", "request_id", r.job.RequestID, "err", err, "bytes", len(msg))
				continue
			}
			// Any message means a worker has the job: from now on only
			// its silence counts. (Workers observe spillway_queue_wait_seconds.)
			started = true
			watchdog.Reset(silence)
			select {
			case r.results <- res:
			case <-r.stop:
				return
			}
			if res.Kind == protocol.KindDone || res.Kind == protocol.KindError {
				return
			}
		case <-r.sub.Done():
			reason, p := "connection_lost", protocol.ResultChannelLost(g.retryAfter())
			if errors.Is(r.sub.Err(), failover.ErrResultOverflow) {
				reason, p = "overflow", protocol.SlowClient(g.retryAfter())
			}
			g.deps.Metrics.SubscriptionLost(reason)
			g.deps.Log.Warn("result subscription ended", "request_id", r.job.RequestID, "err", r.sub.Err())
			r.giveUp(p)
			return
		case <-watchdog.C:
			if started {
				g.deps.Log.Warn("worker silent, giving up", "request_id", r.job.RequestID, "silence", silence.String())
				r.giveUp(protocol.WorkerLost(g.retryAfter()))
			} else {
				g.deps.Metrics.QueueRejected("timeout", r.job.Priority)
				g.deps.Log.Warn("no worker started the job in time", "request_id", r.job.RequestID, "timeout", cfg.QueueTimeout.String())
				r.giveUp(protocol.QueueTimeout(g.retryAfter()))
			}
			return
		case <-r.stop:
			return
		}
	}
}

// Close unsubscribes and, when the answer did not complete, tells the
// workers the client is gone: a waiting job is then skipped and a running
// one cancelled.
func (r *relay) Close(completed bool) {
	r.once.Do(func() {
		close(r.stop)
		r.wg.Wait()
		r.sub.Close()
		if completed {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
		defer cancel()
		// The mark outlives every way the job could still start: the
		// queue wait, a takeover, and the silence before one.
		cfg := r.g.cfg
		ttl := cfg.QueueTimeout + cfg.ReclaimIdle + 6*cfg.WorkerHeartbeat
		if err := r.g.deps.Canceller.Cancel(ctx, r.job.RequestID, ttl); err != nil {
			r.g.deps.Log.Warn("could not tell workers the client left", "request_id", r.job.RequestID, "err", err)
		}
	})
}
