package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/llm/stack"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/redact"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// telemetryStopTimeout bounds flushing the last spans at shutdown.
const telemetryStopTimeout = 5 * time.Second

// deps is what both processes build the same way, once: observability,
// the Redis client, the pool, the provider stack (internal/llm/stack: the
// provider behind its circuit breaker, one per upstream with several, and
// its adaptive limits) and the queue. close releases them newest first,
// after every component built on them stopped.
type deps struct {
	cfg   *config.Config
	log   *slog.Logger
	obs   *observability
	rdb   redis.UniversalClient
	stack *stack.Stack // the provider every call goes through; the api's gate asks its circuit
	pool  pool.Pool
	queue *OpenedQueue
	tel   *telemetry.Provider // tracing; a no-op unless OTEL_* turn it on
	name  string              // this process in the consumer group
	// recent is the cluster-wide last minute of ended requests and queue
	// waits this process adds to (the degradation level's inputs).
	recent *admission.Recent
	// degrade are the degradation level's times (Options.DegradeTimes).
	degrade DegradeTimes
	// runs are the background loops every process runs for its whole
	// life and stops after its last job or stream: recent's flush, the
	// provider stack's adaptive limits.
	runs    []func(context.Context)
	closers []func()
}

// newDeps builds the shared dependencies of a process of role. On error
// it releases what it built.
func newDeps(ctx context.Context, cfg *config.Config, log *slog.Logger, role string, opts Options) (d *deps, err error) {
	// Log lines written with a span in their context carry its ids.
	log = slog.New(telemetry.NewLogHandler(log.Handler()))
	d = &deps{cfg: cfg, log: log, obs: newObservability(), name: InstanceName(role), degrade: opts.DegradeTimes}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	// Tracing first, before any client or component that may start a
	// span; its shutdown is the first closer, so it runs last and flushes
	// the spans of everything closed before it (docs/TRACING.md).
	service := telemetry.ServiceAPI
	if role == roleConsumer {
		service = telemetry.ServiceConsumer
	}
	tel, stopTel, err := telemetry.Setup(ctx, service, log, telemetry.WithMetrics(d.obs.m))
	if err != nil {
		return nil, err
	}
	d.tel = tel
	d.closers = append(d.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetryStopTimeout)
		defer cancel()
		if err := stopTel(sctx); err != nil {
			log.Warn("telemetry: spans not flushed at shutdown", "err", err)
		}
	})
	if d.rdb, err = d.connectRedis(role); err != nil {
		return nil, err
	}
	// Every request's end, as its client saw it, feeds the cluster-wide
	// failure rate of the degradation level (docs/OPERATIONS.md,
	// "Degradation levels"); every call's outcome, when on, the adaptive
	// limit (the provider stack's).
	if d.recent, err = admission.NewRecent(admission.RecentConfig{Prefix: cfg.QueuePrefix, Window: opts.DegradeTimes.Window},
		d.rdb, log.With("component", "degrade")); err != nil {
		return nil, err
	}
	d.runs = append(d.runs, d.recent.Run)
	// The pool before the provider: the adaptive limits live in the
	// pool's store.
	if d.pool, err = d.newPool(role); err != nil {
		return nil, err
	}
	if err := d.newStack(role, opts.Provider); err != nil {
		return nil, err
	}
	if role == roleConsumer || cfg.QueueFailoverEnabled {
		if d.queue, err = OpenQueue(ctx, cfg, d.rdb, log, d.name, d.tel); err != nil {
			return nil, err
		}
		d.closers = append(d.closers, d.queue.Close)
	}
	return d, nil
}

// connectRedis creates the process's Redis client (NewRedisClient: REDIS_URL,
// REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS), or in embedded mode an
// in-process miniredis on a loopback port. The client is closed by close.
func (d *deps) connectRedis(role string) (redis.UniversalClient, error) {
	cfg := d.cfg
	if cfg.Embedded() {
		if role == roleConsumer {
			return nil, fmt.Errorf("consumer: a Redis is required (the consumer has no embedded mode): set REDIS_URL, REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS")
		}
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("app: start embedded miniredis: %w", err)
		}
		d.closers = append(d.closers, mr.Close)
		d.log.Warn("embedded mode: in-process miniredis, workers and provider; for development, not for production",
			"miniredis", mr.Addr())
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		rdb.AddHook(redisTimer{d.obs.m.RedisCommand})
		d.closers = append(d.closers, func() { _ = rdb.Close() })
		return rdb, nil
	}
	// One Redis, a Cluster or a Sentinel-managed primary, by RedisMode;
	// every component takes the client as a redis.UniversalClient.
	rdb, err := NewRedisClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	rdb.AddHook(redisTimer{d.obs.m.RedisCommand})
	d.closers = append(d.closers, func() { _ = rdb.Close() })
	d.log.Info("redis", "mode", cfg.RedisMode(), "url", redact.URL(cfg.RedisURL), "pool_size", cfg.RedisPoolSize, "down_after_ms", cfg.RedisDownAfter.Milliseconds())
	return rdb, nil
}

// newPool builds the pool POOL_BACKEND names: a local one, or the Redis
// pool shared by every api and consumer process, whose fallback state is
// reported in spillway_pool_fallback. With ADAPTIVE_CONCURRENCY the
// provider stack moves the pool's limit, kept in the pool's own store: in
// process for a local pool, in Redis for the shared one
// (docs/OPERATIONS.md, "Adaptive concurrency"); with several upstreams it
// runs one limit per upstream instead and the pool keeps
// CONNECTION_POOL_SIZE.
func (d *deps) newPool(role string) (pool.Pool, error) {
	cfg := d.cfg
	log := d.log.With("component", "pool")
	if cfg.PoolBackend != config.PoolBackendRedis {
		return pool.NewLocal(cfg.ConnectionPoolSize, cfg.ConnectionPoolPerUser)
	}
	m := d.obs.m
	pcfg := RedisPoolConfig(cfg, InstanceName(role))
	if !cfg.Embedded() {
		// The health probe has a connection of its own, so a client pool
		// full of slow calls does not make Redis look dead.
		probe, err := NewRedisProbeClient(cfg)
		if err != nil {
			return nil, err
		}
		d.closers = append(d.closers, func() { _ = probe.Close() })
		leases := redispool.LeasesKey(pcfg.Prefix) // the pool's node in a Cluster
		pcfg.Probe = func(ctx context.Context) error { return probe.Exists(ctx, leases).Err() }
	}
	p, err := redispool.New(pcfg, d.rdb, log, func(on bool) {
		if on {
			m.PoolFallback.Set(1)
		} else {
			m.PoolFallback.Set(0)
		}
	})
	if err != nil {
		return nil, err
	}
	// The pool's leases go before the client closes.
	d.closers = append(d.closers, p.Close)
	return p, nil
}

// requestEnded takes how a request ended, once, where its last call was
// made (the direct path, or the worker that ran its job): the input of
// the degradation level's failure rate (admission.RequestOutcome).
func (d *deps) requestEnded(err error) { d.recent.ObserveRequest(err) }

// workerMetrics is what the workers count through: the metrics, with
// each queue wait also added to the degradation level's inputs.
func (d *deps) workerMetrics() worker.Metrics {
	return waitMetrics{Metrics: d.obs.m, recent: d.recent}
}

// waitMetrics adds queue waits to recent as well as to the histogram.
type waitMetrics struct {
	*metrics.Metrics
	recent *admission.Recent
}

// QueueWaited observes a queue wait.
func (m waitMetrics) QueueWaited(dur time.Duration) {
	m.Metrics.QueueWaited(dur)
	m.recent.ObserveWait(dur)
}

// QueueWaitedTraced observes a queue wait with its trace as exemplar.
func (m waitMetrics) QueueWaitedTraced(ctx context.Context, dur time.Duration) {
	m.Metrics.QueueWaitedTraced(ctx, dur)
	m.recent.ObserveWait(dur)
}

// newStack builds the provider stack every call goes through, direct or
// from a worker, so an open circuit fails fast on both paths
// (stack.New): the provider LLM_PROVIDER names (or injected), each call
// that reached an upstream counted once in
// spillway_upstream_responses_total and, with ADAPTIVE_CONCURRENCY,
// observed by its adaptive limit, beneath its circuit breaker. The
// degradation level does not learn from calls: it counts requests once,
// when they end (requestEnded), so a call that failed and was then served
// by a retry or another upstream is no failure there (docs/OPERATIONS.md,
// "What does not degrade").
func (d *deps) newStack(role string, injected llm.Provider) error {
	sc, err := StackConfig(d.cfg, role, d.name)
	if err != nil {
		return err
	}
	sc.OpenAI.Tracing = d.tel
	sd := stack.Deps{Provider: injected, Redis: d.rdb, Metrics: d.obs.m, Registry: d.obs.reg, Log: d.log}
	if store, ok := d.pool.(adaptive.Store); ok {
		sd.Limits = store // the Redis pool: limits shared by every process
	}
	if local, ok := d.pool.(*pool.Local); ok {
		sd.SetPoolLimit = local.SetLimit
	}
	if d.stack, err = stack.New(sc, sd); err != nil {
		return err
	}
	// The stack stops before the pool and the client it uses.
	d.closers = append(d.closers, d.stack.Close)
	d.runs = append(d.runs, d.stack.Run)
	return nil
}

// provider is the provider behind its circuit(s).
func (d *deps) provider() llm.Provider { return d.stack.Provider() }

// workerProvider is the provider as queue workers call it: behind the same
// circuits, but waiting for an upstream slot where the api's direct path
// would hand its request to the queue.
func (d *deps) workerProvider() llm.Provider { return d.stack.ForWorkers() }

// close releases what newDeps built, newest first: the queue, the pool
// and the clients, then the tracer provider last.
func (d *deps) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
	d.closers = nil
}
