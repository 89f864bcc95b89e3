// Package app wires an api process together from its configuration: the
// provider, the pool, the queue pieces, the HTTP routes and the shutdown
// order. cmd/api and the end-to-end tests both build the api through it.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/pubsub"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/web"
	"github.com/spillway-dev/spillway/internal/web/cors"
)

// API is a built api process: routes and everything behind them.
type API struct {
	cfg     *config.Config
	log     *slog.Logger
	reg     *prometheus.Registry
	m       *metrics.Metrics
	pool    pool.Pool
	handler *stream.Handler
	engine  *gin.Engine
	ready   []func(context.Context) error // readiness checks
	closers []func()                      // run in reverse order by Close

	rdb     redis.UniversalClient
	queue   Queue        // nil when queue failover is off
	waiting atomic.Int64 // jobs no worker has taken, refreshed in the background
	// background runs for the life of Serve, stopped after the HTTP drain
	// (in-process workers, the depth refresh).
	background []func(context.Context)
}

// NewProvider builds the provider LLM_PROVIDER names.
func NewProvider(cfg *config.Config) (llm.Provider, error) {
	switch cfg.LLMProvider {
	case "sim":
		return llm.NewSim(SimConfig(cfg))
	case "openai":
		return llm.NewOpenAI(llm.OpenAIConfig{BaseURL: cfg.LLMBaseURL, APIKey: cfg.LLMAPIKey, Timeout: cfg.LLMTimeout(), FirstTokenTimeout: cfg.LLMFirstTokenTimeout(), IdleTimeout: cfg.LLMIdleTimeout()})
	}
	return nil, fmt.Errorf("app: unknown LLM_PROVIDER %q", cfg.LLMProvider)
}

// SimConfig is the simulator configuration the SIM_* settings give.
func SimConfig(cfg *config.Config) llm.SimConfig {
	return llm.SimConfig{
		FirstToken: cfg.SimFirstToken(), TokenInterval: cfg.SimTokenInterval(), Tokens: cfg.SimTokens,
		Seed: cfg.SimSeed, FailRate: cfg.SimFailRate, FailMidstreamRate: cfg.SimFailMidstreamRate,
	}
}

// Options lets tests replace parts the configuration would build.
type Options struct {
	// Provider replaces the one LLM_PROVIDER names.
	Provider llm.Provider
}

// connectRedis returns the Redis client the process uses: REDIS_URL's, or
// in embedded mode an in-process miniredis on a loopback port. The caller
// closes it (through API.Close).
func (a *API) connectRedis() (redis.UniversalClient, error) {
	if a.cfg.Embedded() {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("app: start embedded miniredis: %w", err)
		}
		a.closers = append(a.closers, mr.Close)
		a.log.Warn("embedded mode: in-process miniredis, workers and provider; for development, not for production",
			"miniredis", mr.Addr())
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		a.closers = append(a.closers, func() { _ = rdb.Close() })
		return rdb, nil
	}
	opts, err := redis.ParseURL(a.cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("app: REDIS_URL: %w", err)
	}
	// Waiting clients hold no connection each (Pub/Sub is multiplexed), but
	// enqueues and cancels need a few under load. Context deadlines bound
	// every command, so a hung Redis cannot hang a request.
	opts.PoolSize = max(opts.PoolSize, 64)
	opts.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opts)
	a.closers = append(a.closers, func() { _ = rdb.Close() })
	return rdb, nil
}

// InstanceName names this process in the consumer group and logs.
func InstanceName(role string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%s-%d-%s", role, host, os.Getpid(), uuid.NewString()[:8])
}

// setupQueue builds the queued path on rdb: queue, result subscriber,
// gateway with its overflow gate, and the in-process workers when
// configured.
func (a *API) setupQueue(rdb redis.UniversalClient, provider llm.Provider) (stream.Spiller, error) {
	cfg := a.cfg
	oq, err := OpenQueue(context.Background(), cfg, rdb, a.log, InstanceName("api"))
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, oq.Close)
	q := oq.Queue
	a.queue = q
	a.ready = append(a.ready, q.Ping)
	sub, err := pubsub.New(pubsub.Config{}, rdb, a.log)
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, func() { _ = sub.Close() })
	gw, err := failover.NewGateway(failover.GatewayConfig{
		Prefix: cfg.QueuePrefix, QueueTimeout: cfg.QueueFailoverTimeout(), WorkerHeartbeat: cfg.WorkerHeartbeat(),
		ReclaimIdle: cfg.QueueReclaimIdle(),
	}, q, sub, rdb, a.m, a.log)
	if err != nil {
		return nil, err
	}
	// One background refresh reads both the backlog (for the overflow
	// gate) and the jobs no worker has taken yet (for queue-first).
	overflow, err := admission.NewOverflow(admission.OverflowConfig{
		Threshold: int64(cfg.QueueOverflowThreshold), Hysteresis: int64(cfg.QueueOverflowHysteresis),
		RefreshEvery: cfg.DepthCacheTTL(), RetryAfterMax: cfg.QueueRetryAfter(),
	}, func(ctx context.Context) (int64, error) {
		if n, err := waitingOrDepth(ctx, q); err == nil {
			a.waiting.Store(n)
		}
		return q.Depth(ctx)
	}, a.m, a.log)
	if err != nil {
		return nil, err
	}
	a.background = append(a.background, overflow.Run)
	gw.SetAdmission(overflow.Check)
	if cfg.WorkersInProcess() {
		w, err := failover.NewWorker(WorkerConfig(cfg), oq.Consumer, a.pool, provider, rdb, a.m, a.log.With("component", "worker"))
		if err != nil {
			return nil, err
		}
		a.background = append(a.background, func(ctx context.Context) { _ = w.Run(ctx) })
	}
	return gw, nil
}

// WorkerConfig is the worker configuration the settings give.
func WorkerConfig(cfg *config.Config) failover.WorkerConfig {
	return failover.WorkerConfig{
		Prefix: cfg.QueuePrefix, Concurrency: cfg.WorkerConcurrency, Heartbeat: cfg.WorkerHeartbeat(),
		BatchSize: cfg.QueueFailoverChunkBatchSize, BatchTimeout: cfg.BatchTimeout(),
		MaxRetries: cfg.QueueFailoverMaxRetries, BaseDelay: cfg.BaseDelay(), MaxDelay: cfg.MaxDelay(),
		QueueTimeout: cfg.QueueFailoverTimeout(), StopGrace: cfg.ShutdownGrace(),
	}
}

// NewAPI builds the api for cfg. Close releases what it built.
func NewAPI(cfg *config.Config, log *slog.Logger, opts Options) (*API, error) {
	a := &API{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.m = metrics.New(a.reg)
	a.m.QueueThreshold.Set(float64(cfg.QueueOverflowThreshold))
	if err := a.build(opts); err != nil {
		a.Close()
		return nil, err
	}
	a.engine = a.routes()
	return a, nil
}

func (a *API) build(opts Options) error {
	cfg, log := a.cfg, a.log
	provider := opts.Provider
	if provider == nil {
		p, err := NewProvider(cfg)
		if err != nil {
			return err
		}
		provider = p
	}
	// Every call to the provider, direct or from a worker, goes through
	// the breaker, so an open circuit fails fast on both paths.
	breaker, err := admission.NewBreaker(admission.DefaultBreakerConfig(), provider, a.m, log)
	if err != nil {
		return err
	}
	rdb, err := a.connectRedis()
	if err != nil {
		return err
	}
	a.rdb = rdb
	a.ready = append(a.ready, func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	if a.pool, err = a.newPool(rdb); err != nil {
		return err
	}
	limiter, err := admission.NewRateLimiter(admission.RateLimitConfig{
		RPS: cfg.RateLimitRPS, Burst: cfg.RateLimitBurst, KeyPrefix: cfg.QueuePrefix,
	}, rdb, a.m, log)
	if err != nil {
		return err
	}
	service, err := admission.NewServiceTime(time.Second, cfg.QueueRetryAfter())
	if err != nil {
		return err
	}
	var spill stream.Spiller
	if cfg.QueueFailoverEnabled {
		if spill, err = a.setupQueue(rdb, breaker); err != nil {
			return err
		}
	}
	h, err := stream.New(stream.Config{
		MaxBodyBytes:      cfg.MaxBodyBytes,
		Limits:            protocol.Limits{MaxMessages: cfg.MaxMessages, MaxTokens: cfg.MaxTokensLimit},
		Heartbeat:         cfg.HeartbeatInterval(),
		DirectPathEnabled: cfg.DirectPathEnabled,
		APIKeys:           cfg.APIKeys,
	}, a.pool, breaker, spill, a.m, log)
	if err != nil {
		return err
	}
	h.SetHooks(stream.Hooks{
		Admit: func(ctx context.Context, identity string) *protocol.Problem {
			if p := limiter.Allow(ctx, identity); p != nil {
				return p
			}
			return breaker.Check()
		},
		RetryAfter:  func() time.Duration { return service.RetryAfter(0, a.pool.Stats().Capacity) },
		ServiceDone: service.Observe,
		QueueFirst:  func() bool { return a.waiting.Load() > 0 },
	})
	a.handler = h
	return nil
}

// newPool builds the pool POOL_BACKEND names.
func (a *API) newPool(rdb redis.UniversalClient) (pool.Pool, error) {
	p, closePool, err := NewPool(a.cfg, rdb, a.m, a.log, "api")
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, closePool)
	return p, nil
}

// NewPool builds the pool POOL_BACKEND names: a local one, or the Redis
// pool shared by every api and consumer process, whose fallback state is
// reported in spillway_pool_fallback. The returned func releases it.
func NewPool(cfg *config.Config, rdb redis.UniversalClient, m *metrics.Metrics, log *slog.Logger, role string) (pool.Pool, func(), error) {
	if cfg.PoolBackend != config.PoolBackendRedis {
		p, err := pool.NewLocal(cfg.ConnectionPoolSize, cfg.ConnectionPoolPerUser)
		return p, func() {}, err
	}
	p, err := redispool.New(redispool.Config{
		Prefix: cfg.QueuePrefix + "pool:", Size: cfg.ConnectionPoolSize, PerUser: cfg.ConnectionPoolPerUser,
		LeaseTTL: cfg.LeaseTTL(), FallbackSize: cfg.PoolLocalFallbackSize, Holder: InstanceName(role),
	}, rdb, log.With("component", "pool"), func(on bool) {
		if on {
			m.PoolFallback.Set(1)
		} else {
			m.PoolFallback.Set(0)
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return p, p.Close, nil
}

// Handler returns the HTTP handler of every api route.
func (a *API) Handler() http.Handler { return a.engine }

// Close releases what NewAPI built, newest first.
func (a *API) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

func (a *API) routes() *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.HandleMethodNotAllowed = true
	// CORS first: refusals, 404/405 and panics must carry its headers too.
	if p := cors.New(cors.Config{AllowedOrigins: a.cfg.CORSAllowedOrigins}); p.Enabled() {
		e.Use(p.Gin())
	}
	// A panic in a handler is a bug; the client still gets a problem
	// document, and the log gets the stack.
	e.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, err any) {
		a.log.Error("handler panicked", "path", c.Request.URL.Path, "panic", fmt.Sprint(err), "stack", string(debug.Stack()))
		stream.WriteProblem(c.Writer, protocol.NewProblem(protocol.ProblemInternal, "Internal Error",
			http.StatusInternalServerError, "The request failed unexpectedly; retry it."), c.Request.URL.Path)
		c.Abort()
	}))
	streamHandler := gin.WrapH(a.handler)
	e.POST("/v1/stream", streamHandler)
	e.POST("/stream", streamHandler)
	e.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	e.GET("/readyz", a.readyz)
	e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(a.gatherer(), promhttp.HandlerOpts{})))
	if a.cfg.ChatPageEnabled {
		e.GET("/", gin.WrapH(web.Handler()))
	}
	e.NoRoute(func(c *gin.Context) {
		stream.WriteProblem(c.Writer, protocol.NewProblem(protocol.ProblemNotFound, "Not Found", http.StatusNotFound,
			"No such endpoint."), c.Request.URL.Path)
	})
	e.NoMethod(func(c *gin.Context) {
		stream.WriteProblem(c.Writer, protocol.NewProblem(protocol.ProblemMethodNotAllowed, "Method Not Allowed",
			http.StatusMethodNotAllowed, "This endpoint does not take "+c.Request.Method+"."), c.Request.URL.Path)
	})
	return e
}

// gatherer refreshes the gauges owned by other components just before each
// scrape, so they cost nothing between scrapes.
func (a *API) gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		st := a.pool.Stats()
		a.m.PoolSlotsInUse.Set(float64(st.InUse))
		a.m.PoolSlotsCapacity.Set(float64(st.Capacity))
		if a.queue != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if n, err := a.queue.DeadLetterDepth(ctx); err == nil {
				a.m.DeadLetterDepth.Set(float64(n))
			}
			cancel()
		}
		return a.reg.Gather()
	})
}

func (a *API) readyz(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
	defer cancel()
	for _, check := range a.ready {
		if err := check(ctx); err != nil {
			a.log.Warn("not ready", "err", err)
			stream.WriteProblem(c.Writer, protocol.NewProblem("not-ready", "Not Ready", http.StatusServiceUnavailable,
				"A dependency is unreachable.").WithRetryAfter(1), c.Request.URL.Path)
			return
		}
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}

// Serve answers on ln until ctx ends, then shuts down gracefully: it stops
// accepting, lets open streams finish for SHUTDOWN_GRACE_SECONDS, ends the
// rest with an `error` event (shutting-down) and returns once every stream
// has ended.
func (a *API) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           a.engine,
		ReadHeaderTimeout: 10 * time.Second,
		// No WriteTimeout: it would cut long streams; the SSE writer sets a
		// deadline per write instead.
		IdleTimeout: 120 * time.Second,
	}
	// Workers outlive the HTTP drain: queued streams still open need them.
	workersCtx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWorkers()
	var workers sync.WaitGroup
	defer workers.Wait()
	defer stopWorkers() // runs before workers.Wait
	for _, run := range a.background {
		workers.Go(func() { run(workersCtx) })
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("app: serve: %w", err)
	case <-ctx.Done():
	}
	grace := a.cfg.ShutdownGrace()
	a.log.Info("shutting down: draining open streams", "grace", grace.String())
	drainTimer := time.AfterFunc(grace, a.handler.Drain)
	defer drainTimer.Stop()
	// Shutdown closes the listener at once and waits for streams to end;
	// after the grace period Drain ends them, so this returns soon after.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+10*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	a.handler.Drain()
	a.handler.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("app: shutdown: %w", err)
	}
	<-errc
	return nil
}

// Run builds the api, listens on HTTP_ADDR and serves until ctx ends.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	a, err := NewAPI(cfg, log, Options{})
	if err != nil {
		return err
	}
	defer a.Close()
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("app: listen %s: %w", cfg.HTTPAddr, err)
	}
	log.Info("api listening", "addr", ln.Addr().String(), "pool_size", cfg.ConnectionPoolSize,
		"per_user", cfg.ConnectionPoolPerUser, "provider", cfg.LLMProvider)
	return a.Serve(ctx, ln)
}
