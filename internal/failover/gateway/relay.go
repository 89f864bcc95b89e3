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
// It keeps only the job's names and deadline, never its payload: a
// waiting stream must cost little (docs/BENCHMARKS.md).
type relay struct {
	g       *Gateway
	job     waitingJob
	left    sync.Once // the job left the queue: its quota is released
	sub     failover.ResultSubscription
	results chan protocol.Result
	done    chan struct{} // closed when the relay gave up; problem says why
	stop    chan struct{} // closed by Close
	problem *protocol.Problem
	wg      sync.WaitGroup
	started sync.Once   // the goroutine was started, or will never be
	wake    *time.Timer // starts it at the queue deadline; nil when started at once
	once    sync.Once
}

// waitingJob is what the relay needs of a job.
type waitingJob struct {
	RequestID, UserID string
	Deadline          time.Time
	Priority          protocol.Priority
}

// readyNotifier is a subscription that can say when it has something to
// read (pubsub.Subscription.OnReady).
type readyNotifier interface {
	OnReady(func())
}

func startRelay(g *Gateway, job protocol.Job, sub failover.ResultSubscription) *relay {
	r := &relay{g: g, job: waitingJob{RequestID: job.RequestID, UserID: job.UserID, Deadline: job.Deadline, Priority: job.Priority}, sub: sub, results: make(chan protocol.Result, g.cfg.Buffer),
		done: make(chan struct{}), stop: make(chan struct{})}
	// While the job waits in the queue there is nothing to relay: the
	// goroutine starts when the worker's first message (or the end of
	// the subscription) arrives, or at the queue deadline to give up,
	// so a waiting stream costs no goroutine of its own
	// (docs/bench-history/2026-11.md, "Waiting streams").
	if n, ok := sub.(readyNotifier); ok {
		r.wake = time.AfterFunc(time.Until(job.Deadline), r.start)
		n.OnReady(r.start)
	} else {
		r.start()
	}
	return r
}

// start starts the relay's goroutine, once; after Close, never.
func (r *relay) start() {
	r.started.Do(func() { r.wg.Go(r.run) })
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

// leftQueue releases the job's quota once, without waiting for Redis: it
// started, expired or its client left.
func (r *relay) leftQueue() {
	r.left.Do(func() { r.g.releaseLater(r.job) })
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
	seq := newSequencer()
	// heal runs while a gap is open: the missing chunks may still come
	// (a retried publish overtaken by the next) or the worker's reset may
	// void them; after one heartbeat the gap is final.
	heal := time.NewTimer(time.Hour)
	heal.Stop()
	defer heal.Stop()
	healing := false
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
			v := seq.accept(res)
			for range v.dups {
				g.deps.Metrics.ResultDropped(ResultDuplicate)
			}
			if v.stale {
				// A worker that lost the job still speaks: fenced off, and
				// its words are no sign of life of the one that has it.
				g.deps.Metrics.ResultDropped(ResultStale)
				g.deps.Log.Info("result of an older attempt dropped", "request_id", r.job.RequestID,
					"attempt", res.Attempt, "current", seq.attempt, "kind", res.Kind.String())
				continue
			}
			// Any message means a worker has the job: from now on only
			// its silence counts. (Workers observe spillway_queue_wait_seconds.)
			if !started {
				r.leftQueue()
			}
			started = true
			watchdog.Reset(silence)
			for _, out := range v.out {
				select {
				case r.results <- out:
				case <-r.stop:
					return
				}
				if out.Kind == protocol.KindDone || out.Kind == protocol.KindError {
					return
				}
			}
			if v.broken {
				g.deps.Metrics.StreamGap(GapBroken)
				g.deps.Log.Warn("chunks missing from the answer; ending the stream", "request_id", r.job.RequestID,
					"attempt", seq.attempt, "next_seq", seq.next)
				r.giveUp(protocol.StreamGap(g.retryAfter()))
				return
			}
			switch {
			case v.waiting && !healing:
				healing = true
				heal.Reset(cfg.WorkerHeartbeat)
			case !v.waiting && healing:
				healing = false
				heal.Stop()
				g.deps.Metrics.StreamGap(GapHealed)
			}
		case <-heal.C:
			g.deps.Metrics.StreamGap(GapBroken)
			g.deps.Log.Warn("gap in the answer did not heal; ending the stream", "request_id", r.job.RequestID,
				"attempt", seq.attempt, "next_seq", seq.next, "wait", cfg.WorkerHeartbeat.String())
			r.giveUp(protocol.StreamGap(g.retryAfter()))
			return
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
		// A relay whose goroutine has not started never will: Wait then
		// cannot race a late start.
		r.started.Do(func() {})
		if r.wake != nil {
			r.wake.Stop()
		}
		close(r.stop)
		r.wg.Wait()
		r.sub.Close()
		r.leftQueue()
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
