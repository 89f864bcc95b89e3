package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover/pubsub"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
)

// GatewayConfig configures the api side of the queued path.
type GatewayConfig struct {
	// Prefix is QUEUE_PREFIX, default "queue:".
	Prefix string
	// QueueTimeout is the longest wait for a worker to start a job
	// (QUEUE_FAILOVER_TIMEOUT_SECONDS, default 30s).
	QueueTimeout time.Duration
	// WorkerHeartbeat is WORKER_HEARTBEAT_SECONDS (default 5s): silence of
	// three heartbeats from a started job means its worker is gone.
	WorkerHeartbeat time.Duration
	// ReclaimIdle is QUEUE_RECLAIM_IDLE_SECONDS (default 15s): how long a
	// takeover of a dead worker's job may take.
	ReclaimIdle time.Duration
	// RetryAfter is advised when the queue cannot take a job. Default 2s.
	RetryAfter time.Duration
	// Buffer is results held for a slow client. Default 64.
	Buffer int
}

// Validate reports bad values without changing c.
func (c GatewayConfig) Validate() error {
	var errs []error
	if c.Prefix == "" {
		errs = append(errs, errors.New("failover: gateway Prefix is empty"))
	}
	if c.QueueTimeout <= 0 || c.WorkerHeartbeat <= 0 || c.ReclaimIdle <= 0 {
		errs = append(errs, errors.New("failover: gateway QueueTimeout, WorkerHeartbeat and ReclaimIdle must be positive"))
	}
	return errors.Join(errs...)
}

// Gateway is the api's queued path: it subscribes to a request's result
// channel, enqueues the job, and relays what the workers publish. It
// implements stream.Spiller.
type Gateway struct {
	cfg      GatewayConfig
	producer Producer
	sub      *pubsub.Subscriber
	rdb      redis.UniversalClient
	m        *metrics.Metrics
	log      *slog.Logger
	now      func() time.Time
	// admit, when set, may refuse a job before it is enqueued (overflow,
	// open circuit); it returns the problem to send.
	admit func() *protocol.Problem
}

var _ stream.Spiller = (*Gateway)(nil)

// NewGateway returns the queued path. rdb carries cancel notices; sub the
// result channels; producer the jobs. None of them is closed by Gateway.
func NewGateway(cfg GatewayConfig, producer Producer, sub *pubsub.Subscriber, rdb redis.UniversalClient,
	m *metrics.Metrics, log *slog.Logger) (*Gateway, error) {
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = 2 * time.Second
	}
	if cfg.Buffer == 0 {
		cfg.Buffer = 64
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if producer == nil || sub == nil || rdb == nil || m == nil || log == nil {
		return nil, errors.New("failover: gateway needs a producer, subscriber, redis client, metrics and logger")
	}
	return &Gateway{cfg: cfg, producer: producer, sub: sub, rdb: rdb, m: m, log: log, now: time.Now}, nil
}

// SetAdmission installs a check run before every enqueue; a non-nil
// problem refuses the job. Call it before serving.
func (g *Gateway) SetAdmission(admit func() *protocol.Problem) { g.admit = admit }

var (
	problemQueueTimeout = protocol.NewProblem(protocol.ProblemQueueTimeout, "Queue Timeout",
		http.StatusServiceUnavailable, "No worker started the request in time; retry shortly.")
	problemWorkerLost = protocol.NewProblem(protocol.ProblemWorkerLost, "Worker Lost",
		http.StatusServiceUnavailable, "The worker answering the request stopped and no other took over; retry the request.")
	problemConnectionLost = protocol.NewProblem(protocol.ProblemQueueUnavailable, "Result Channel Lost",
		http.StatusServiceUnavailable, "The connection carrying the answer was lost; retry the request.")
	problemSlowClient = protocol.NewProblem(protocol.ProblemSlowClient, "Client Too Slow",
		http.StatusServiceUnavailable, "The stream was ended because the client did not read it fast enough.")
	problemTooLarge = protocol.NewProblem(protocol.ProblemBodyTooLarge, "Request Too Large To Queue",
		http.StatusRequestEntityTooLarge, "The request is too large to be queued; shorten it.")
)

func (g *Gateway) retryAfter() int { return max(1, int(g.cfg.RetryAfter/time.Second)) }

// Spill subscribes, then enqueues, then returns the relay. See
// stream.Spiller.
func (g *Gateway) Spill(ctx context.Context, job protocol.Job) (stream.Relay, error) {
	if g.admit != nil {
		if p := g.admit(); p != nil {
			return nil, p
		}
	}
	now := g.now()
	job.EnqueueTime = now
	job.Deadline = now.Add(g.cfg.QueueTimeout)
	body, err := protocol.EncodeJob(job)
	if err != nil {
		g.m.QueueRejections.WithLabelValues("too_large").Inc()
		return nil, problemTooLarge
	}
	sub, err := g.sub.Subscribe(ctx, ResultChannel(g.cfg.Prefix, job.RequestID))
	if err != nil {
		g.m.QueueRejections.WithLabelValues("subscribe_failed").Inc()
		g.log.Error("subscribe to result channel failed", "request_id", job.RequestID, "err", err)
		return nil, protocol.QueueUnavailable(g.retryAfter())
	}
	// Subscribed and confirmed: nothing a worker publishes can be missed.
	if err := g.producer.Enqueue(ctx, job.RequestID, body); err != nil {
		sub.Close()
		g.m.QueueRejections.WithLabelValues("enqueue_failed").Inc()
		g.log.Error("enqueue failed", "request_id", job.RequestID, "err", err)
		return nil, protocol.QueueUnavailable(g.retryAfter())
	}
	r := &relay{g: g, job: job, sub: sub, results: make(chan protocol.Result, g.cfg.Buffer),
		done: make(chan struct{}), stop: make(chan struct{})}
	r.wg.Add(1)
	go r.run()
	return r, nil
}

// relay turns one subscription into decoded results and watches the
// worker's liveness.
type relay struct {
	g       *Gateway
	job     protocol.Job
	sub     *pubsub.Subscription
	results chan protocol.Result
	done    chan struct{} // closed when the relay gave up; problem says why
	stop    chan struct{} // closed by Close
	problem *protocol.Problem
	wg      sync.WaitGroup
	once    sync.Once
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

func (r *relay) run() {
	defer r.wg.Done()
	cfg := r.g.cfg
	hb := cfg.WorkerHeartbeat
	// Before a worker speaks, only the queue timeout applies; after, the
	// silence limit: 3 heartbeats, then a takeover window of
	// ReclaimIdle + 3 heartbeats.
	silence := 3*hb + cfg.ReclaimIdle + 3*hb
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
				r.g.m.MalformedMessages.WithLabelValues("result_channel").Inc()
				r.g.log.Warn("malformed result message skipped", "request_id", r.job.RequestID, "err", err, "bytes", len(msg))
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
			reason, p := "connection_lost", problemConnectionLost
			if errors.Is(r.sub.Err(), pubsub.ErrOverflow) {
				reason, p = "overflow", problemSlowClient
			}
			r.g.m.SubscriptionsLost.WithLabelValues(reason).Inc()
			r.g.log.Warn("result subscription ended", "request_id", r.job.RequestID, "err", r.sub.Err())
			r.giveUp(p.WithRetryAfter(r.g.retryAfter()))
			return
		case <-watchdog.C:
			if started {
				r.g.log.Warn("worker silent, giving up", "request_id", r.job.RequestID, "silence", silence.String())
				r.giveUp(problemWorkerLost.WithRetryAfter(r.g.retryAfter()))
			} else {
				r.g.m.QueueRejections.WithLabelValues("timeout").Inc()
				r.g.log.Warn("no worker started the job in time", "request_id", r.job.RequestID, "timeout", cfg.QueueTimeout.String())
				r.giveUp(problemQueueTimeout.WithRetryAfter(r.g.retryAfter()))
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
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ttl := r.g.cfg.QueueTimeout + r.g.cfg.ReclaimIdle + 6*r.g.cfg.WorkerHeartbeat
		_, err := r.g.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, CancelKey(r.g.cfg.Prefix, r.job.RequestID), "1", ttl)
			p.Publish(ctx, CancelChannel(r.g.cfg.Prefix), r.job.RequestID)
			return nil
		})
		if err != nil {
			r.g.log.Warn("could not tell workers the client left", "request_id", r.job.RequestID, "err", fmt.Errorf("cancel: %w", err))
		}
	})
}
