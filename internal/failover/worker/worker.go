// Package worker owns the consumer worker (docs/ARCHITECTURE.md, "Queued
// path"): it takes jobs from a failover.Consumer, waits for a pool slot,
// streams the answer from the provider and publishes it on the job's
// result channel, on the failover contracts alone. One file per background
// component: fetch.go (fetch loop), slot.go (fair scheduling of worker
// and pool slots across identities), retry.go (retry
// policy), publish.go (publisher and batching), heartbeat.go (heartbeats
// and claim refresh), cancel.go (cancel watch), settle.go (ack and dead
// letter); job.go runs one job through them. Run states the stop order.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// Defaults of the worker's settings (docs/OPERATIONS.md, "Settings").
const (
	// DefaultConcurrency is WORKER_CONCURRENCY's default.
	DefaultConcurrency = 16
	// DefaultHeartbeat is WORKER_HEARTBEAT_SECONDS' default.
	DefaultHeartbeat = 5 * time.Second
	// DefaultBatchSize is QUEUE_FAILOVER_CHUNK_BATCH_SIZE's default.
	DefaultBatchSize = 5
	// DefaultBatchTimeout is QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS' default.
	DefaultBatchTimeout = 100 * time.Millisecond
	// DefaultMaxRetries is QUEUE_FAILOVER_MAX_RETRIES' default.
	DefaultMaxRetries = 5
	// DefaultStopGrace is SHUTDOWN_GRACE_SECONDS' default, the api's drain
	// included; config sets Config.StopGrace from it.
	DefaultStopGrace = 25 * time.Second
)

// DefaultPublishBudget is the default Config.PublishBudget.
const DefaultPublishBudget = 2 * time.Second

// Config configures a worker. Zero fields take the stated defaults; the
// others are required.
type Config struct {
	// Concurrency is jobs running at once (WORKER_CONCURRENCY): jobs that
	// hold a worker slot, that is a pool slot or a turn to ask for one.
	Concurrency int
	// MaxParked bounds the fetched jobs that wait, parked, because their
	// identity is at its per-user limit; the fetch loop fetches no more
	// while it is reached. Parking lets a
	// worker reach past one identity's backlog to other identities' jobs
	// (docs/QUEUE.md, "Fairness"); its memory is at most MaxParked job
	// bodies. Default 4 × Concurrency.
	MaxParked int
	// Heartbeat is WORKER_HEARTBEAT_SECONDS: how often a running job tells
	// its client and the queue that it is alive.
	Heartbeat time.Duration
	// BatchSize and BatchTimeout say when a batch of chunks is published
	// (QUEUE_FAILOVER_CHUNK_BATCH_SIZE, _BATCH_TIMEOUT_MS): once it holds
	// BatchSize chunks, or BatchTimeout after its first. Chunks that arrive
	// while a batch is out join the next, up to max(BatchSize, 64).
	BatchSize    int
	BatchTimeout time.Duration
	// MaxRetries is provider retries before dead-letter
	// (QUEUE_FAILOVER_MAX_RETRIES); 0 retries none.
	MaxRetries int
	// Retry is how long to wait before each retry (docs/TIMEOUTS.md): an
	// upstream Retry-After up to LLM_RETRY_AFTER_MAX_SECONDS, else backoff
	// from QUEUE_FAILOVER_BASE_DELAY_MS to _MAX_DELAY_MS. Zero fields take
	// llm's defaults.
	Retry llm.RetryPolicy
	// QueueTimeout bounds the wait for a slot of a job taken over from a
	// dead worker, and all retry and open-circuit waits of one job
	// together (QUEUE_FAILOVER_TIMEOUT_SECONDS).
	QueueTimeout time.Duration
	// StopGrace is how long running jobs may finish after Run's context
	// ends (SHUTDOWN_GRACE_SECONDS); the rest stay pending for takeover.
	// 0 gives none: running jobs are left for takeover at once, as the
	// api's drain of 0 ends its streams at once. Unlike the other fields,
	// 0 is no default: config passes DefaultStopGrace when unset.
	StopGrace time.Duration
	// QueueSystem ("redis" or "kafka") and QueueName (stream or topic)
	// describe the queue on the job span.
	QueueSystem, QueueName string
	// ReclaimIdle is QUEUE_RECLAIM_IDLE_SECONDS. A job whose claim was
	// last refreshed longer than ReclaimIdle minus one Heartbeat ago
	// publishes nothing more: another worker may have taken it over
	// (docs/QUEUE.md, "Fencing and gaps"). 0 turns the fence off.
	ReclaimIdle time.Duration
	// PublishBudget bounds the retries of one result message; a batch
	// not out within it makes the answer start again after a reset.
	// Default 2s.
	PublishBudget time.Duration
	// PriorityAging is PRIORITY_AGING_SECONDS: a job waits for its pool
	// slot at its place in line (protocol.PlaceInLine), so priorities
	// order the pool's waiters as they order the queue. Default
	// protocol.DefaultPriorityAging.
	PriorityAging time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxParked == 0 {
		c.MaxParked = 4 * c.Concurrency
	}
	if c.PublishBudget == 0 {
		c.PublishBudget = DefaultPublishBudget
	}
	if c.PriorityAging == 0 {
		c.PriorityAging = protocol.DefaultPriorityAging
	}
	return c
}

// baseDelay is the retry policy's first backoff, also the pause after a
// failed fetch and the shortest wait on an open circuit.
func (c Config) baseDelay() time.Duration { return cmp.Or(c.Retry.BaseDelay, llm.DefaultBaseDelay) }

// Validate reports bad values without changing c, each field out of
// range as a *bounds.Error.
func (c Config) Validate() error {
	c = c.withDefaults()
	errs := []error{
		bounds.AtLeast("Concurrency", c.Concurrency, 1),
		bounds.AtLeast("BatchSize", c.BatchSize, 1),
		bounds.AtLeast("MaxRetries", c.MaxRetries, 0),
		bounds.AtLeast("MaxParked", c.MaxParked, 0),
		bounds.AtLeast("Heartbeat", c.Heartbeat, 1),
		bounds.AtLeast("BatchTimeout", c.BatchTimeout, 1),
		bounds.AtLeast("QueueTimeout", c.QueueTimeout, 1),
		bounds.AtLeast("StopGrace", c.StopGrace, 0),
		bounds.AtLeast("PriorityAging", c.PriorityAging, 0),
		bounds.AtLeast("PublishBudget", c.PublishBudget, 0),
		c.Retry.Validate(),
	}
	if c.ReclaimIdle != 0 && c.ReclaimIdle <= c.Heartbeat {
		errs = append(errs, errors.New("ReclaimIdle (when set) must exceed Heartbeat"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// Job outcomes, the label values of spillway_worker_jobs_total.
const (
	OutcomeDone       = "done"
	OutcomeError      = "error"
	OutcomeExpired    = "expired"
	OutcomeCancelled  = "cancelled"
	OutcomeDeadLetter = "dead_letter"
)

// Metrics is what the worker counts. *metrics.Metrics implements it.
type Metrics interface {
	// JobSettled counts a finished job by outcome.
	JobSettled(outcome string)
	// Retried counts a provider call retried, or an open circuit waited
	// out, by reason (llm.Reason, or circuit_open).
	Retried(reason string)
	// QueueWaited observes enqueue to slot.
	QueueWaited(time.Duration)
	// MalformedMessage counts a message skipped, by source.
	MalformedMessage(source string)
}

type nopMetrics struct{}

func (nopMetrics) JobSettled(string)         {}
func (nopMetrics) Retried(string)            {}
func (nopMetrics) QueueWaited(time.Duration) {}
func (nopMetrics) MalformedMessage(string)   {}

// Deps are what a Worker uses; it closes none of them.
type Deps struct {
	// Consumer hands out jobs. Required.
	Consumer failover.Consumer
	// Pool bounds provider calls. Required.
	Pool pool.Pool
	// Provider answers. Required.
	Provider llm.Provider
	// Results publishes answers. Required.
	Results failover.ResultPublisher
	// Cancels tells of clients that left. Required.
	Cancels failover.CancelWatcher
	// Metrics defaults to counting nothing.
	Metrics Metrics
	// Log is required.
	Log *slog.Logger
	// Tracing continues each job's trace; nil traces nothing.
	Tracing *telemetry.Provider
	// Ended, when set, is told how each job's request ended once the
	// worker gave its client a terminal event: the provider's last error
	// after every retry, nil for a complete answer. It is not called for
	// a job cancelled or given up for lack of a slot. It must not block.
	Ended func(err error)
}

// Worker takes jobs from a Consumer and answers them.
type Worker struct {
	cfg  Config
	deps Deps
	log  *slog.Logger
	m    Metrics

	cancels *cancelWatch
	fetcher *fetcher
	sched   *scheduler
}

// New returns a worker.
func New(cfg Config, deps Deps) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Consumer == nil || deps.Pool == nil || deps.Provider == nil || deps.Results == nil || deps.Cancels == nil || deps.Log == nil {
		return nil, errors.New("worker: needs a consumer, pool, provider, result publisher, cancel watcher and logger")
	}
	if deps.Metrics == nil {
		deps.Metrics = nopMetrics{}
	}
	w := &Worker{cfg: cfg.withDefaults(), deps: deps, log: deps.Log, m: deps.Metrics}
	w.cancels = newCancelWatch(deps.Cancels, deps.Log)
	w.fetcher = newFetcher(w.cfg, deps.Consumer, deps.Log)
	w.sched = newScheduler(deps.Pool, w.cfg.Concurrency, w.cfg.MaxParked)
	return w, nil
}

// Causes a job's context is cancelled with.
var (
	// errClientGone: the client left; the job is settled as cancelled.
	errClientGone = errors.New("client gone")
	// errClaimLost: another worker took the job over; it is not settled.
	errClaimLost = errors.New("claim lost")
	// errStopping: the stop grace is over; the job is left unacknowledged
	// for another worker to take over.
	errStopping = errors.New("worker stopping")
)

// Run fetches and answers jobs until ctx ends, then stops. Stop order, and
// why (like asynq's Server.Stop):
//
//  1. The fetch loop and the takeover loop stop: ctx ended, so no new
//     job starts.
//  2. Running jobs finish within StopGrace; then they are cancelled with
//     errStopping and left unacknowledged, so another worker takes them
//     over (docs/QUEUE.md, "Takeover"). Jobs run on a context that
//     outlives ctx for this.
//  3. The scheduler's recheck timer stops: no job is left to schedule.
//  4. The cancel watch stops, last: until the last job ended, a client
//     that leaves must still cancel it.
func (w *Worker) Run(ctx context.Context) error {
	jobsCtx, cancelJobs := context.WithCancelCause(context.WithoutCancel(ctx))
	if err := w.cancels.start(jobsCtx); err != nil {
		cancelJobs(nil)
		return err
	}
	var jobs, loops sync.WaitGroup
	handle := func(d failover.Delivery) bool { return w.handle(jobsCtx, d) }
	if r, ok := w.deps.Consumer.(failover.Reclaimer); ok {
		loops.Go(func() { w.fetcher.takeovers(ctx, r, w.sched, &jobs, handle) })
	}
	w.fetcher.run(ctx, w.sched, &jobs, handle)
	loops.Wait()

	w.log.Info("worker stopping: waiting for running jobs", "grace", w.cfg.StopGrace.String())
	finished := make(chan struct{})
	go func() { jobs.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(w.cfg.StopGrace):
		w.log.Warn("stop grace over: leaving running jobs for takeover")
		cancelJobs(errStopping)
		<-finished
	}
	w.sched.stop()
	w.cancels.terminate()
	cancelJobs(errStopping)
	return nil
}
