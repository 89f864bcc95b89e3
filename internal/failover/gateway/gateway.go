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
	"net/http"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// queueSystemKafka is the QueueSystem whose jobs carry their trace context
// in record headers.
const queueSystemKafka = "kafka"

// Defaults of zero Config fields.
const (
	// DefaultRetryAfter is advised when the queue cannot take a job.
	DefaultRetryAfter = 2 * time.Second
	// DefaultQueueTimeout is QUEUE_FAILOVER_TIMEOUT_SECONDS' default: the
	// longest wait for a worker to start a job.
	DefaultQueueTimeout = 30 * time.Second
	// DefaultBuffer is results held between the relay and the handler.
	// It is small: the subscription's own buffer (pubsub.DefaultBuffer
	// messages, allocated only once the worker speaks) is the slack for
	// a slow client, and this one is allocated for every waiting stream.
	DefaultBuffer = 8
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
	// Buffer is results held between the relay and the handler. Default 8.
	Buffer int
	// QueueSystem is the queue's messaging.system on the enqueue span
	// ("redis" or "kafka"), QueueName the stream or topic. On "kafka" the
	// trace context travels in record headers (the Producer writes them
	// from the context Enqueue gets), not in the job (docs/TRACING.md).
	QueueSystem, QueueName string
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
	// ResultDropped counts a well-formed result message the relay did not
	// pass on, by reason: ResultStale or ResultDuplicate.
	ResultDropped(reason string)
	// StreamGap counts a gap in an answer's sequence once it closed, by
	// outcome: GapHealed or GapBroken.
	StreamGap(outcome string)
}

// Reasons of Metrics.ResultDropped and outcomes of Metrics.StreamGap
// (docs/METRICS.md, "Result subscriptions (api)").
const (
	// ResultStale: an older attempt wrote it (a worker that lost the job).
	ResultStale = "stale_attempt"
	// ResultDuplicate: every chunk of the batch had passed already (a
	// publish retried after its reply was lost).
	ResultDuplicate = "duplicate"
	// GapHealed: the missing chunks arrived late, or a reset voided them.
	GapHealed = "healed"
	// GapBroken: the gap did not heal and the stream ended in stream-gap.
	GapBroken = "broken"
)

type nopMetrics struct{}

func (nopMetrics) QueueRejected(string, protocol.Priority) {}
func (nopMetrics) MalformedMessage(string)                 {}
func (nopMetrics) SubscriptionLost(string)                 {}
func (nopMetrics) ResultDropped(string)                    {}
func (nopMetrics) StreamGap(string)                        {}

// Quota bounds what waits in the queue, per identity and in bytes, across
// every api process; admission.Quota implements it. Safe for concurrent
// use.
type Quota interface {
	// Reserve counts a job for at most wait: nil, nil when it may queue; a
	// problem when a bound refuses it; an error when the count failed.
	Reserve(ctx context.Context, identity, requestID string, bytes int, wait time.Duration) (*protocol.Problem, error)
	// Release uncounts the job once it left the queue; twice is harmless.
	Release(ctx context.Context, identity, requestID string) error
}

// Deps are what a Gateway uses; it closes none of them.
type Deps struct {
	// Producer enqueues jobs. Required.
	Producer failover.Producer
	// Results subscribes to result channels. Required.
	Results failover.ResultSubscriber
	// Canceller tells workers a client left. Required.
	Canceller failover.Canceller
	// Quota, when set, bounds the jobs waiting per identity and their
	// bytes (QUEUE_MAX_PER_IDENTITY, QUEUE_MAX_BYTES).
	Quota Quota
	// Metrics defaults to counting nothing.
	Metrics Metrics
	// Log is required.
	Log *slog.Logger
	// Tracing starts the enqueue span and carries its context to the
	// worker; nil traces nothing.
	Tracing *telemetry.Provider
}

// Gateway is the api's queued path. Safe for concurrent use.
type Gateway struct {
	cfg      Config
	deps     Deps
	now      func() time.Time
	releases *releaser // nil without a Quota
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
	g := &Gateway{cfg: cfg.withDefaults(), deps: deps, now: time.Now}
	if deps.Quota != nil {
		g.releases = newReleaser(deps.Quota, deps.Log)
	}
	return g, nil
}

func (g *Gateway) retryAfter() int { return protocol.RetryAfterSeconds(g.cfg.RetryAfter) }

// Spill subscribes, then enqueues, then returns the relay. See
// failover.Spiller.
func (g *Gateway) Spill(ctx context.Context, job protocol.Job) (failover.Relay, error) {
	now := g.now()
	job.EnqueueTime = now
	job.Deadline = now.Add(g.cfg.QueueTimeout)
	// The enqueue span covers subscribe and enqueue; the job carries its
	// context, so the worker's spans become its children.
	ctx, span := g.deps.Tracing.StartEnqueue(ctx, g.cfg.QueueSystem, g.cfg.QueueName, job.RequestID)
	defer span.End()
	if g.cfg.QueueSystem != queueSystemKafka {
		job.Trace = g.deps.Tracing.InjectJob(ctx)
	}
	body, err := protocol.EncodeJob(job)
	if limit := g.maxJobBytes(); err != nil || len(body) > limit {
		// It will never fit: refused before anything is subscribed.
		g.deps.Metrics.QueueRejected("too_large", job.Priority)
		return nil, protocol.TooLargeToQueue(limit)
	}
	sub, err := g.reserveAndSubscribe(ctx, job, len(body))
	if p, ok := errors.AsType[*protocol.Problem](err); ok {
		return nil, p
	}
	if errors.Is(err, errReserve) {
		return nil, protocol.QueueUnavailable(g.retryAfter())
	}
	if err != nil {
		g.release(job)
		g.deps.Metrics.QueueRejected("subscribe_failed", job.Priority)
		g.deps.Log.Error("subscribe to result channel failed", "request_id", job.RequestID, "err", err)
		return nil, protocol.QueueUnavailable(g.retryAfter())
	}
	// Subscribed and confirmed: nothing a worker publishes can be missed
	// (docs/QUEUE.md, invariant 1).
	if err := g.enqueue(ctx, job, body); err != nil {
		sub.Close()
		g.release(job)
		if errors.Is(err, failover.ErrJobTooLarge) {
			// The queue learned a lower limit than the one checked above
			// (Kafka's topic, read at start).
			g.deps.Metrics.QueueRejected("too_large", job.Priority)
			g.deps.Log.Warn("job refused by the queue as too large", "request_id", job.RequestID, "bytes", len(body), "err", err)
			return nil, protocol.TooLargeToQueue(g.maxJobBytes())
		}
		g.deps.Metrics.QueueRejected("enqueue_failed", job.Priority)
		g.deps.Log.Error("enqueue failed", "request_id", job.RequestID, "err", err)
		return nil, protocol.QueueUnavailable(g.retryAfter())
	}
	return startRelay(g, job, sub), nil
}

// errReserve is what reserveAndSubscribe returns when the quota count
// failed (reserve logged and counted it).
var errReserve = errors.New("queue quota failed")

// reserveAndSubscribe counts the job against the quota and subscribes to
// its result channel at the same time: neither needs the other, and a
// queued stream's first chunk waits for each round trip on the way in
// (docs/QUEUE.md, "Order of operations"). A refusal (a
// *protocol.Problem) or a failed count closes the subscription as soon as
// it is made; a failed subscribe returns its error, and Spill gives the
// count back.
func (g *Gateway) reserveAndSubscribe(ctx context.Context, job protocol.Job, bytes int) (failover.ResultSubscription, error) {
	if g.deps.Quota == nil {
		return g.deps.Results.SubscribeResults(ctx, job.RequestID)
	}
	type subscribed struct {
		sub failover.ResultSubscription
		err error
	}
	subC := make(chan subscribed, 1)
	go func() {
		sub, err := g.deps.Results.SubscribeResults(ctx, job.RequestID)
		subC <- subscribed{sub, err}
	}()
	p, err := g.reserve(ctx, job, bytes)
	if p != nil || err != nil {
		go func() {
			if s := <-subC; s.err == nil {
				s.sub.Close()
			}
		}()
		if p != nil {
			return nil, p
		}
		return nil, errReserve
	}
	s := <-subC
	if s.err != nil {
		return nil, s.err
	}
	return s.sub, nil
}

// enqueue puts the job in its priority's line when the queue keeps one
// per priority (failover.PriorityProducer), else in the one line.
func (g *Gateway) enqueue(ctx context.Context, job protocol.Job, body []byte) error {
	if pp, ok := g.deps.Producer.(failover.PriorityProducer); ok {
		return pp.EnqueuePriority(ctx, job.RequestID, job.Priority, body)
	}
	return g.deps.Producer.Enqueue(ctx, job.RequestID, body)
}

// maxJobBytes is the largest encoded job the queue takes: the job
// format's own bound, lowered by a Producer that states a smaller one.
func (g *Gateway) maxJobBytes() int {
	limit := protocol.MaxJobBytes
	if l, ok := g.deps.Producer.(failover.JobLimiter); ok {
		limit = min(limit, l.MaxJobBytes())
	}
	return limit
}

// reserve counts the job against the quota: a problem refuses it, an
// error means the count failed (then the queue, on the same Redis, would
// most likely fail too: the caller answers queue-unavailable).
func (g *Gateway) reserve(ctx context.Context, job protocol.Job, bytes int) (*protocol.Problem, error) {
	if g.deps.Quota == nil {
		return nil, nil
	}
	p, err := g.deps.Quota.Reserve(ctx, job.UserID, job.RequestID, bytes, g.cfg.QueueTimeout)
	switch {
	case err != nil:
		g.deps.Metrics.QueueRejected("enqueue_failed", job.Priority)
		g.deps.Log.Error("queue quota failed", "request_id", job.RequestID, "err", err)
	case p != nil && p.Status == http.StatusTooManyRequests:
		g.deps.Metrics.QueueRejected("too_many_queued", job.Priority)
	case p != nil:
		g.deps.Metrics.QueueRejected("overflow", job.Priority)
	}
	return p, err
}

// release uncounts a job that never made it into the queue, before Spill
// returns. It runs on a context of its own.
func (g *Gateway) release(job protocol.Job) {
	if g.deps.Quota == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	if err := g.deps.Quota.Release(ctx, job.UserID, job.RequestID); err != nil {
		// The entry expires at the job's deadline anyway.
		g.deps.Log.Warn("queue quota release failed", "request_id", job.RequestID, "err", err)
	}
}

// releaseLater uncounts a job that left the queue (it started, expired or
// its client left) without waiting for it: see releaser.
func (g *Gateway) releaseLater(job waitingJob) {
	if g.releases != nil {
		g.releases.release(job.UserID, job.RequestID)
	}
}

// Wait returns once every job that left the queue so far is uncounted
// from the quota (or its release failed and was logged). For tests and a
// clean stop; the quota's entries expire at their jobs' deadlines anyway.
func (g *Gateway) Wait() {
	if g.releases != nil {
		g.releases.wait()
	}
}
