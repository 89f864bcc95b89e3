package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// WorkerConfig configures a consumer worker.
type WorkerConfig struct {
	// Prefix is QUEUE_PREFIX, default "queue:".
	Prefix string
	// Concurrency is jobs at once (WORKER_CONCURRENCY, default 16).
	Concurrency int
	// Heartbeat is WORKER_HEARTBEAT_SECONDS (default 5s): how often a
	// running job tells its client and the queue that it is alive.
	Heartbeat time.Duration
	// BatchSize and BatchTimeout bound a published batch of chunks
	// (QUEUE_FAILOVER_CHUNK_BATCH_SIZE 5, _BATCH_TIMEOUT_MS 100ms).
	BatchSize    int
	BatchTimeout time.Duration
	// MaxRetries is provider retries before dead-letter
	// (QUEUE_FAILOVER_MAX_RETRIES, default 5).
	MaxRetries int
	// BaseDelay and MaxDelay bound the exponential backoff
	// (QUEUE_FAILOVER_BASE_DELAY_MS 100ms, _MAX_DELAY_MS 5s).
	BaseDelay, MaxDelay time.Duration
	// QueueTimeout bounds the wait for a slot of a job taken over from a
	// dead worker (QUEUE_FAILOVER_TIMEOUT_SECONDS, default 30s).
	QueueTimeout time.Duration
	// StopGrace is how long running jobs may finish after Run's context
	// ends; the rest stay pending for takeover. Default 20s.
	StopGrace time.Duration
}

// Validate reports bad values without changing c.
func (c WorkerConfig) Validate() error {
	var errs []error
	if c.Prefix == "" {
		errs = append(errs, errors.New("failover: worker Prefix is empty"))
	}
	if c.Concurrency < 1 || c.BatchSize < 1 || c.MaxRetries < 0 {
		errs = append(errs, errors.New("failover: worker Concurrency and BatchSize must be positive, MaxRetries not negative"))
	}
	if c.Heartbeat <= 0 || c.BatchTimeout <= 0 || c.BaseDelay <= 0 || c.MaxDelay < c.BaseDelay || c.QueueTimeout <= 0 {
		errs = append(errs, errors.New("failover: worker durations must be positive and MaxDelay at least BaseDelay"))
	}
	return errors.Join(errs...)
}

// Worker takes jobs from a Consumer and answers them: it waits for a pool
// slot, streams from the provider, and publishes batches, heartbeats and a
// DONE or ERROR signal on the job's result channel.
type Worker struct {
	cfg      WorkerConfig
	consumer Consumer
	pool     pool.Pool
	provider llm.Provider
	rdb      redis.UniversalClient
	m        *metrics.Metrics
	log      *slog.Logger

	mu      sync.Mutex
	running map[string]context.CancelCauseFunc // request id → cancel
	// inflight holds the delivery ids this process is answering. A
	// delivery of one of them again means this process's own claim went
	// idle and it reclaimed it: the running answer goes on, the copy is
	// dropped.
	inflight map[string]bool
}

// NewWorker returns a worker. It closes none of the clients it is given.
func NewWorker(cfg WorkerConfig, consumer Consumer, p pool.Pool, provider llm.Provider, rdb redis.UniversalClient,
	m *metrics.Metrics, log *slog.Logger) (*Worker, error) {
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 20 * time.Second
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if consumer == nil || p == nil || provider == nil || rdb == nil || m == nil || log == nil {
		return nil, errors.New("failover: worker needs a consumer, pool, provider, redis client, metrics and logger")
	}
	return &Worker{cfg: cfg, consumer: consumer, pool: p, provider: provider, rdb: rdb, m: m, log: log,
		running: make(map[string]context.CancelCauseFunc), inflight: make(map[string]bool)}, nil
}

// errClientGone cancels a job whose client left.
var errClientGone = errors.New("client gone")

// errClaimLost cancels a job another worker took over; it is not settled.
var errClaimLost = errors.New("claim lost")

// errStopping cancels jobs still running when the stop grace is over; they
// are left unacknowledged for another worker to take over.
var errStopping = errors.New("worker stopping")

// Run fetches and answers jobs until ctx ends. Shutdown order: stop
// fetching; let running jobs finish within StopGrace; cancel the rest and
// leave them pending for takeover; stop listening for cancel notices.
func (w *Worker) Run(ctx context.Context) error {
	// Jobs run on a context that outlives ctx by the stop grace.
	jobsCtx, cancelJobs := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelJobs(errStopping)

	cancels := w.rdb.Subscribe(jobsCtx, CancelChannel(w.cfg.Prefix))
	defer cancels.Close()
	var listeners sync.WaitGroup
	listeners.Go(func() { w.listenCancels(cancels) })
	defer listeners.Wait()
	defer cancels.Close() // ends listenCancels; runs before listeners.Wait

	slots := make(chan struct{}, w.cfg.Concurrency)
	var jobs sync.WaitGroup
	for ctx.Err() == nil {
		// Wait for at least one free slot, then fetch as many jobs as are free.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		free := 1
	fill:
		for free < w.cfg.Concurrency {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break fill
			}
		}
		ds, err := w.consumer.Fetch(ctx, free)
		if err != nil && ctx.Err() == nil {
			w.log.Error("fetch failed", "err", err)
			select { // back off a little so a dead Redis is not hammered
			case <-time.After(w.cfg.BaseDelay):
			case <-ctx.Done():
			}
		}
		for range free - len(ds) {
			<-slots
		}
		for _, d := range ds {
			if !w.claim(d.ID) {
				w.log.Warn("own job reclaimed while still running; keeping the running answer", "delivery", d.ID)
				<-slots
				continue
			}
			jobs.Go(func() {
				defer func() { <-slots }()
				defer w.unclaim(d.ID)
				w.handle(jobsCtx, d)
			})
		}
	}
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
	return nil
}

// claim marks delivery id as being answered here; false when it already is.
func (w *Worker) claim(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inflight[id] {
		return false
	}
	w.inflight[id] = true
	return true
}

func (w *Worker) unclaim(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inflight, id)
}

func (w *Worker) listenCancels(ps *redis.PubSub) {
	for msg := range ps.Channel() {
		w.mu.Lock()
		cancel := w.running[msg.Payload]
		w.mu.Unlock()
		if cancel != nil {
			cancel(errClientGone)
		}
	}
}

// Running returns how many jobs the worker is answering now.
func (w *Worker) Running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.running)
}

// handle answers one delivery and settles it: ack, dead-letter, or (when
// the worker stops mid-job) nothing, so another worker takes it over.
func (w *Worker) handle(ctx context.Context, d Delivery) {
	job, err := protocol.DecodeJob(d.Body)
	if err != nil {
		w.m.MalformedMessages.WithLabelValues("queue").Inc()
		w.log.Warn("malformed job dead-lettered", "delivery", d.ID, "err", err)
		w.settle(ctx, d, "", metrics.JobDeadLetter, "malformed job: "+err.Error())
		return
	}
	log := w.log.With("request_id", job.RequestID, "attempt", d.Attempt)
	gone, err := w.rdb.Exists(ctx, CancelKey(w.cfg.Prefix, job.RequestID)).Result()
	if err != nil {
		log.Warn("cancel check failed; running the job", "err", err)
	}
	if gone > 0 {
		log.Info("client gone before start; job skipped")
		w.settle(ctx, d, job.RequestID, metrics.JobCancelled, "")
		return
	}
	now := time.Now()
	if d.Attempt <= 1 && now.After(job.Deadline) {
		log.Info("job expired before start; skipped", "waited", now.Sub(job.EnqueueTime).String())
		w.settle(ctx, d, job.RequestID, metrics.JobExpired, "")
		return
	}

	jobCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w.mu.Lock()
	w.running[job.RequestID] = cancel
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.running, job.RequestID)
		w.mu.Unlock()
	}()

	pub := &publisher{w: w, channel: ResultChannel(w.cfg.Prefix, job.RequestID), cancel: cancel, log: log}
	// The first heartbeat tells the api a worker has the job, before the
	// slot wait, so the queue timeout no longer applies.
	pub.send(jobCtx, protocol.Result{Kind: protocol.KindHeartbeat})
	var beats sync.WaitGroup
	beats.Go(func() { w.heartbeat(jobCtx, d, pub) })
	defer beats.Wait()
	defer cancel(nil) // stops the heartbeat before Wait

	if d.Attempt > 1 {
		pub.send(jobCtx, protocol.Result{Kind: protocol.KindReset, Reset: &protocol.Reset{Attempt: d.Attempt}})
	}
	outcome, reason := w.answer(jobCtx, job, d, pub, log)
	switch cause := context.Cause(jobCtx); {
	case errors.Is(cause, errStopping):
		log.Warn("worker stopped mid-job; left for takeover")
		return
	case errors.Is(cause, errClaimLost):
		return
	}
	w.settle(ctx, d, job.RequestID, outcome, reason)
}

// answer waits for a slot and streams the answer with retries. It returns
// the job outcome and, for a dead letter, the reason.
func (w *Worker) answer(ctx context.Context, job protocol.Job, d Delivery, pub *publisher, log *slog.Logger) (string, string) {
	slotDeadline := job.Deadline
	if d.Attempt > 1 {
		slotDeadline = time.Now().Add(w.cfg.QueueTimeout)
	}
	slotCtx, cancelSlot := context.WithDeadline(ctx, slotDeadline)
	var lease pool.Lease
	var err error
	if qp, ok := w.pool.(pool.Queued); ok {
		// Slots go to jobs in the order they were queued, not the order
		// this process's goroutines reach the pool.
		lease, err = qp.AcquireSince(slotCtx, job.UserID, job.EnqueueTime)
	} else {
		lease, err = w.pool.Acquire(slotCtx, job.UserID)
	}
	cancelSlot()
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return metrics.JobCancelled, ""
		}
		log.Warn("no pool slot before the deadline", "err", err)
		pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: problemQueueTimeout.WithRetryAfter(2)})
		return metrics.JobExpired, ""
	}
	defer lease.Release()
	w.m.QueueWait.Observe(time.Since(job.EnqueueTime).Seconds())

	bo := &backoff.ExponentialBackOff{
		InitialInterval: w.cfg.BaseDelay, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: w.cfg.MaxDelay,
	}
	bo.Reset()
	var circuitWait time.Duration // waited on an open circuit, bounded by QueueTimeout
	for attempt := 0; ; {
		b := newBatcher(pub, w.cfg.BatchSize, w.cfg.BatchTimeout)
		res, err := w.provider.Stream(ctx, job.Payload, func(content string) error { return b.add(ctx, content) })
		if err == nil {
			b.flush(ctx)
			usage := res.Usage
			pub.send(ctx, protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{
				RequestID: job.RequestID, FinishReason: res.FinishReason, Path: metrics.PathQueued, Usage: &usage,
			}})
			return metrics.JobDone, ""
		}
		if ctx.Err() != nil {
			return metrics.JobCancelled, ""
		}
		// Chunks still in the batch never reached the client: dropping them
		// keeps a retry invisible to it.
		if b.discard() > 0 {
			// Chunks reached the client: a retry would repeat them.
			log.Warn("provider failed mid-answer", "err", err)
			pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderFailed(2)})
			return metrics.JobError, ""
		}
		var le *llm.Error
		if errors.Is(err, admission.ErrCircuitOpen) && errors.As(err, &le) {
			// The provider is known to be down: wait for the circuit to
			// half-open instead of burning retries, as long as a client
			// would wait for a queued job to start.
			wait := max(le.RetryAfter, w.cfg.BaseDelay)
			if circuitWait+wait > w.cfg.QueueTimeout {
				log.Warn("provider circuit stayed open; giving up", "waited", circuitWait.String())
				pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderUnavailable(int(w.cfg.QueueTimeout / time.Second))})
				return metrics.JobError, ""
			}
			circuitWait += wait
			log.Info("provider circuit open; waiting", "wait", wait.String())
			select {
			case <-time.After(wait):
				continue
			case <-ctx.Done():
				return metrics.JobCancelled, ""
			}
		}
		if !llm.IsRetryable(err) || attempt >= w.cfg.MaxRetries {
			log.Error("provider failed; dead-lettering", "retries", attempt, "err", err)
			pub.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.ProviderFailed(2)})
			return metrics.JobDeadLetter, fmt.Sprintf("provider failed after %d retries: %v", attempt, err)
		}
		attempt++
		delay := min(bo.NextBackOff(), w.cfg.MaxDelay) // jitter may exceed MaxInterval
		if errors.As(err, &le) && le.RetryAfter > delay {
			delay = min(le.RetryAfter, w.cfg.MaxDelay)
		}
		w.m.WorkerRetries.Inc()
		log.Info("provider failed; retrying", "retry", attempt, "delay", delay.String(), "err", err)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return metrics.JobCancelled, ""
		}
	}
}

// heartbeat publishes SIGNAL:HEARTBEAT and refreshes the queue claim every
// heartbeat until ctx ends.
func (w *Worker) heartbeat(ctx context.Context, d Delivery, pub *publisher) {
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := w.consumer.Touch(ctx, d); err != nil && ctx.Err() == nil {
				if errors.Is(err, ErrClaimLost) {
					// Another worker took the job over (this one stalled past
					// the reclaim time): it answers now, this one stops.
					pub.log.Warn("job taken over by another worker; stopping", "err", err)
					pub.cancel(errClaimLost)
					return
				}
				pub.log.Warn("could not refresh the job's claim", "err", err)
			}
			pub.send(ctx, protocol.Result{Kind: protocol.KindHeartbeat})
		}
	}
}

// settle acknowledges or dead-letters d on a context of its own, so a
// cancelled job is still settled.
func (w *Worker) settle(ctx context.Context, d Delivery, requestID, outcome, reason string) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var err error
	if outcome == metrics.JobDeadLetter {
		err = w.consumer.DeadLetter(sctx, d, reason)
	} else {
		err = w.consumer.Ack(sctx, d)
	}
	if err != nil {
		w.log.Error("could not settle job; it will be redelivered", "request_id", requestID, "outcome", outcome, "err", err)
	}
	w.m.WorkerJobs.WithLabelValues(outcome).Inc()
}

// publisher sends results on one job's channel. PUBLISH reaching nobody
// means the api stopped listening: the client is gone, so the job is
// cancelled.
type publisher struct {
	w       *Worker
	channel string
	cancel  context.CancelCauseFunc
	log     *slog.Logger
	mu      sync.Mutex
}

func (p *publisher) send(ctx context.Context, r protocol.Result) {
	msg, err := protocol.EncodeResult(r)
	if err != nil {
		p.log.Error("cannot encode result", "kind", r.Kind.String(), "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Publish even when ctx is cancelled, so a final ERROR still goes out.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	n, err := p.w.rdb.Publish(pctx, p.channel, msg).Result()
	switch {
	case err != nil:
		p.log.Warn("publish failed", "kind", r.Kind.String(), "err", err)
	case n == 0 && ctx.Err() == nil:
		p.log.Info("nobody listens on the result channel; cancelling the job")
		p.cancel(errClientGone)
	}
}

// batcher groups chunks into BATCH messages of at most size chunks, sent
// when full or timeout after the batch's first chunk, whichever first. The
// answer's very first chunk is sent alone, at once.
type batcher struct {
	pub     *publisher
	size    int
	timeout time.Duration

	mu    sync.Mutex
	buf   []protocol.Chunk
	seq   int
	sent  int
	timer *time.Timer
}

func newBatcher(pub *publisher, size int, timeout time.Duration) *batcher {
	return &batcher{pub: pub, size: size, timeout: timeout, buf: make([]protocol.Chunk, 0, size)}
}

func (b *batcher) add(ctx context.Context, content string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	b.buf = append(b.buf, protocol.Chunk{Seq: b.seq, Content: content})
	// The first chunk goes out at once: time to first chunk is what a
	// waiting user feels; batching pays off on the chunks after it.
	if b.seq == 1 || len(b.buf) >= b.size {
		b.flushLocked(ctx)
	} else if len(b.buf) == 1 {
		b.timer = time.AfterFunc(b.timeout, func() { b.flush(ctx) })
	}
	return nil
}

func (b *batcher) flush(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked(ctx)
}

func (b *batcher) flushLocked(ctx context.Context) {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if len(b.buf) == 0 {
		return
	}
	if ctx.Err() != nil {
		// The job was cancelled (client gone, claim lost, worker
		// stopping): nobody may receive more of this attempt.
		b.buf = b.buf[:0]
		return
	}
	b.pub.send(ctx, protocol.Result{Kind: protocol.KindBatch, Chunks: b.buf})
	b.sent += len(b.buf)
	b.buf = make([]protocol.Chunk, 0, b.size)
}

// discard drops unsent chunks and returns how many were published.
func (b *batcher) discard() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.buf = b.buf[:0]
	return b.sent
}
