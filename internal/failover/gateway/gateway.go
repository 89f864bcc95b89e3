// Package gateway owns the api's queued path (docs/ARCHITECTURE.md,
// "Queued path"): for one request it subscribes to the result channel,
// enqueues the job, relays what the workers publish while watching their
// liveness, and tells them when the client left. It implements
// failover.Spiller on the failover contracts alone, with no backend.
package gateway

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Defaults of zero Config fields.
const (
	// DefaultRetryAfter is advised when the queue cannot take a job.
	DefaultRetryAfter = 2 * time.Second
	// DefaultBuffer is results held between the subscription and a slow
	// handler; the handler's own frame buffer is in front of it.
	DefaultBuffer = 64
	// cancelTimeout bounds telling the workers a client left; it runs
	// after the request ended, on a context of its own.
	cancelTimeout = 2 * time.Second
)

// Config configures the api side of the queued path. Zero fields take the
// stated defaults.
type Config struct {
	// QueueTimeout is the longest wait for a worker to start a job
	// (QUEUE_FAILOVER_TIMEOUT_SECONDS). Required.
	QueueTimeout time.Duration
	// WorkerHeartbeat is WORKER_HEARTBEAT_SECONDS: silence of three
	// heartbeats from a started job means its worker is gone. Required.
	WorkerHeartbeat time.Duration
	// ReclaimIdle is QUEUE_RECLAIM_IDLE_SECONDS: how long a takeover of a
	// dead worker's job may take. Required.
	ReclaimIdle time.Duration
	// RetryAfter is advised when the queue cannot take a job. Default 2s.
	RetryAfter time.Duration
	// Buffer is results held for a slow client. Default 64.
	Buffer int
}

func (c Config) withDefaults() Config {
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultBuffer
	}
	return c
}

// Validate reports bad values without changing c.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.QueueTimeout <= 0 || c.WorkerHeartbeat <= 0 || c.ReclaimIdle <= 0 {
		errs = append(errs, errors.New("gateway: QueueTimeout, WorkerHeartbeat and ReclaimIdle must be positive"))
	}
	if c.RetryAfter < 0 || c.Buffer < 0 {
		errs = append(errs, errors.New("gateway: RetryAfter and Buffer must not be negative"))
	}
	return errors.Join(errs...)
}

// Metrics is what the gateway counts. *metrics.Metrics implements it.
type Metrics interface {
	// QueueRejected counts a request not queued, by reason.
	QueueRejected(reason string, prio protocol.Priority)
	// MalformedMessage counts a message skipped, by source.
	MalformedMessage(source string)
	// SubscriptionLost counts a result subscription that ended on its own.
	SubscriptionLost(reason string)
}

type nopMetrics struct{}

func (nopMetrics) QueueRejected(string, protocol.Priority) {}
func (nopMetrics) MalformedMessage(string)                 {}
func (nopMetrics) SubscriptionLost(string)                 {}

// Deps are what a Gateway uses; it closes none of them.
type Deps struct {
	// Producer enqueues jobs. Required.
	Producer failover.Producer
	// Results subscribes to result channels. Required.
	Results failover.ResultSubscriber
	// Canceller tells workers a client left. Required.
	Canceller failover.Canceller
	// Metrics defaults to counting nothing.
	Metrics Metrics
	// Log is required.
	Log *slog.Logger
}

// Gateway is the api's queued path. Safe for concurrent use.
type Gateway struct {
	cfg  Config
	deps Deps
	now  func() time.Time
}

var _ failover.Spiller = (*Gateway)(nil)

// New returns the queued path.
func New(cfg Config, deps Deps) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Producer == nil || deps.Results == nil || deps.Canceller == nil || deps.Log == nil {
		return nil, errors.New("gateway: needs a producer, a result subscriber, a canceller and a logger")
	}
	if deps.Metrics == nil {
		deps.Metrics = nopMetrics{}
	}
	return &Gateway{cfg: cfg.withDefaults(), deps: deps, now: time.Now}, nil
}

func (g *Gateway) retryAfter() int { return max(1, int(g.cfg.RetryAfter/time.Second)) }

// Spill subscribes, then enqueues, then returns the relay. See
// failover.Spiller.
func (g *Gateway) Spill(ctx context.Context, job protocol.Job) (failover.Relay, error) {
	now := g.now()
	job.EnqueueTime = now
	job.Deadline = now.Add(g.cfg.QueueTimeout)
	body, err := protocol.EncodeJob(job)
	if err != nil {
		g.deps.Metrics.QueueRejected("too_large", job.Priority)
		return nil, protocol.TooLargeToQueue()
	}
	sub, err := g.deps.Results.SubscribeResults(ctx, job.RequestID)
	if err != nil {
		g.deps.Metrics.QueueRejected("subscribe_failed", job.Priority)
		g.deps.Log.Error("subscribe to result channel failed", "request_id", job.RequestID, "err", err)
		return nil, protocol.QueueUnavailable(g.retryAfter())
	}
	// Subscribed and confirmed: nothing a worker publishes can be missed
	// (docs/QUEUE.md, invariant 1).
	if err := g.deps.Producer.Enqueue(ctx, job.RequestID, body); err != nil {
		sub.Close()
		g.deps.Metrics.QueueRejected("enqueue_failed", job.Priority)
		g.deps.Log.Error("enqueue failed", "request_id", job.RequestID, "err", err)
		return nil, protocol.QueueUnavailable(g.retryAfter())
	}
	return startRelay(g, job, sub), nil
}
