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
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/pool/adaptive"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/redact"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// telemetryStopTimeout bounds flushing the last spans at shutdown.
const telemetryStopTimeout = 5 * time.Second

// deps is what both processes build the same way, once: observability,
// the Redis client, the provider behind its circuit breaker (one per
// upstream with several), the pool and the queue. close releases them
// newest first, after every component built on them stopped.
type deps struct {
	cfg     *config.Config
	log     *slog.Logger
	obs     *observability
	rdb     redis.UniversalClient
	llm     llm.Provider      // the provider every call goes through, behind its circuit(s)
	circuit admission.Circuit // what the api's gate asks before admitting
	pool    pool.Pool
	queue   *OpenedQueue
	tel     *telemetry.Provider // tracing; a no-op unless OTEL_* turn it on
	name    string              // this process in the consumer group
	// recent is the cluster-wide last minute of ended requests and queue
	// waits this process adds to (the degradation level's inputs).
	recent *admission.Recent
	// degrade are the degradation level's times (Options.DegradeTimes).
	degrade DegradeTimes
	// adaptive moves the pool's limit (ADAPTIVE_CONCURRENCY); nil when off
	// or when each upstream has its own (newBalancer).
	adaptive *adaptive.Controller
	// runs are the background loops every process runs for its whole
	// life and stops after its last job or stream: recent's flush.
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
	// limit (newPool builds it).
	if d.recent, err = admission.NewRecent(admission.RecentConfig{Prefix: cfg.QueuePrefix, Window: opts.DegradeTimes.Window},
		d.rdb, log.With("component", "degrade")); err != nil {
		return nil, err
	}
	d.runs = append(d.runs, d.recent.Run)
	// The pool before the provider: with several upstreams, their
	// adaptive limits live in the pool's store.
	if d.pool, err = d.newPool(role, opts.Provider == nil && usesBalancer(cfg)); err != nil {
		return nil, err
	}
	if err := d.newProvider(role, opts.Provider); err != nil {
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
// reported in spillway_pool_fallback. With ADAPTIVE_CONCURRENCY it also
// builds the controller that moves the pool's limit, kept in the pool's
// own store: in process for a local pool, in Redis for the shared one
// (docs/OPERATIONS.md, "Adaptive concurrency"); unless perUpstream, when
// the Balancer runs one limit per upstream instead (newBalancer) and the
// pool keeps CONNECTION_POOL_SIZE.
func (d *deps) newPool(role string, perUpstream bool) (pool.Pool, error) {
	cfg := d.cfg
	log := d.log.With("component", "pool")
	if cfg.PoolBackend != config.PoolBackendRedis {
		p, err := pool.NewLocal(cfg.ConnectionPoolSize, cfg.ConnectionPoolPerUser)
		if err != nil {
			return nil, err
		}
		if cfg.AdaptiveConcurrency && !perUpstream {
			if d.adaptive, err = adaptive.New(AdaptiveConfig(cfg), adaptive.NewLocalStore(), log, p.SetLimit); err != nil {
				return nil, err
			}
			d.runs = append(d.runs, d.adaptive.Run)
		}
		return p, nil
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
	if cfg.AdaptiveConcurrency && !perUpstream {
		if d.adaptive, err = adaptive.New(AdaptiveConfig(cfg), p, log, nil); err != nil {
			return nil, err
		}
		d.runs = append(d.runs, d.adaptive.Run)
	}
	return p, nil
}

// observeCall takes one provider call's outcome (llm.Observe): the
// adaptive limit learns from every call. The degradation level does not:
// it counts requests once, when they end (requestEnded), so a call that
// failed and was then served by a retry or another upstream is no failure
// there (docs/OPERATIONS.md, "What does not degrade").
func (d *deps) observeCall(c llm.Call) {
	if d.adaptive != nil {
		d.adaptive.Observe(c)
	}
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

// newProvider builds the provider every call goes through, direct or from
// a worker, so an open circuit fails fast on both paths; beneath the
// circuit, each call that reached the upstream is counted once in
// spillway_upstream_responses_total, and observed (observeCall). A
// single provider (injected, the
// simulator, or one plain upstream) sits behind one breaker. Several
// upstreams each sit behind their own, inside the Balancer
// (docs/UPSTREAMS.md, "Health"): one failing replica opens only its
// circuit and is routed around, and the gate refuses only while every
// circuit is open.
func (d *deps) newProvider(role string, injected llm.Provider) error {
	cfg := d.cfg
	if injected == nil && usesBalancer(cfg) {
		b, circuits, err := d.newBalancer(role)
		if err != nil {
			return err
		}
		// The balancer's answer, after its retries on other upstreams, is
		// what the pool's adaptive limit and the error rate learn from.
		d.llm, d.circuit = llm.Observe(b, d.observeCall), circuits
		return nil
	}
	p, label := injected, ""
	if p == nil {
		var err error
		if p, err = newProvider(cfg, d.tel); err != nil {
			return err
		}
		if cfg.LLMProvider == config.ProviderOpenAI && len(cfg.Upstreams) == 1 {
			label = cfg.Upstreams[0].Name
		}
	}
	if label == "" {
		label = p.Name()
	}
	m := d.obs.m
	m.UpstreamKnown(label)
	counted := llm.CountResponses(p, func(code string) { m.UpstreamResponded(label, code) })
	observed := llm.Observe(counted, d.observeCall)
	br, err := admission.NewBreaker(BreakerConfig(cfg), observed, m, d.log)
	if err != nil {
		return err
	}
	d.llm, d.circuit = br, br
	return nil
}

// provider is the provider behind its circuit(s).
func (d *deps) provider() llm.Provider { return d.llm }

// workerProvider is the provider as queue workers call it: behind the same
// circuits, but waiting for an upstream slot where the api's direct path
// would hand its request to the queue.
func (d *deps) workerProvider() llm.Provider { return waitingProvider{d.llm} }

// close releases what newDeps built, newest first: the queue, the pool
// and the clients, then the tracer provider last.
func (d *deps) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
	d.closers = nil
}
