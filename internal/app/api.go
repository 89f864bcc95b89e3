package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm/upstream/models"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/telemetry"
	"github.com/spillway-dev/spillway/internal/web"
	"github.com/spillway-dev/spillway/internal/web/cors"
)

// HTTP server timeouts of the api. There is no WriteTimeout: it would cut
// long streams; the SSE writer sets a deadline per write instead.
const (
	readHeaderTimeout = 10 * time.Second
	// readyTimeout bounds one /readyz check of every dependency.
	readyTimeout = 2 * time.Second
	// notReadyRetryAfter is advised, in seconds, while a dependency is
	// unreachable: readiness is checked again at once.
	notReadyRetryAfter = 1
)

// API is a built api process: routes and everything behind them.
type API struct {
	*deps
	handler *stream.Handler
	models  *models.Catalog // GET /v1/models and /v1/models/{id}
	engine  *gin.Engine
	drain   *drainer                      // the stream routes' requests, for the shutdown
	ready   []func(context.Context) error // readiness checks
	// background runs for the life of Serve and stops after the HTTP
	// drain (in-process workers, the overflow gate's depth refresh).
	background []func(context.Context)
	// own are what NewAPI built on deps, closed before them.
	own []func()
	// canceller announces stops and cancellations (results.Subscriber).
	canceller failover.Canceller
	// conns is Serve's connection limiter, once Serve runs (tests read
	// which connections it counts idle).
	conns atomic.Pointer[limitListener]
}

// NewAPI builds the api for cfg. Close releases what it built.
func NewAPI(cfg *config.Config, log *slog.Logger, opts Options) (*API, error) {
	d, err := newDeps(context.Background(), cfg, log, roleAPI, opts)
	if err != nil {
		return nil, err
	}
	a := &API{deps: d, drain: newDrainer()}
	// Memory held after a burst of streams goes back to the system.
	a.background = append(a.background, newMemReturner(log.With("component", "memory")).Run)
	if err := a.build(); err != nil {
		a.Close()
		return nil, err
	}
	metricsH, err := a.obs.metricsHandler(cfg)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.engine = a.routes(metricsH)
	return a, nil
}

func (a *API) build() error {
	cfg, log, m := a.cfg, a.log, a.obs.m
	m.QueueThreshold.Set(float64(cfg.QueueOverflowThreshold))
	rdb := a.rdb
	a.ready = append(a.ready, func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	limiter, err := admission.NewRateLimiter(RateLimitConfig(cfg), rdb, m, log)
	if err != nil {
		return err
	}
	service, err := admission.NewServiceTime(serviceTimeInitial, cfg.QueueRetryAfter)
	if err != nil {
		return err
	}
	gate := admission.GateDeps{Limiter: limiter, Circuit: a.stack, Metrics: m, Service: service, Pool: a.pool}
	var spill failover.Spiller
	if a.queue != nil {
		if spill, gate.Overflow, err = a.buildQueued(); err != nil {
			return err
		}
		a.obs.watch(a.pool, a.queue.Queue.DeadLetterDepth)
	} else {
		a.obs.watch(a.pool, nil)
	}
	// The degradation level reads the backlog the overflow gate caches
	// and the last minute every process reports (docs/OPERATIONS.md,
	// "Degradation levels").
	dc := DegradeConfig(cfg)
	dc.RaiseAfter, dc.Hold = a.degrade.RaiseAfter, a.degrade.Hold
	if gate.Degrader, err = admission.NewDegrader(dc, admission.Sources{Overflow: gate.Overflow, Recent: a.recent},
		m, log.With("component", "degrade")); err != nil {
		return err
	}
	a.background = append(a.background, gate.Degrader.Run)
	a.background = append(a.background, a.runs...)
	g, err := admission.NewGate(gate)
	if err != nil {
		return err
	}
	logw, logr, err := a.buildStreamLog()
	if err != nil {
		return err
	}
	a.handler, err = stream.New(StreamConfig(cfg), stream.Deps{
		Pool: a.pool, Provider: a.provider(), Spiller: spill, Gate: g, Metrics: m, Log: log, Tracing: a.tel,
		LogWriter: logw, LogReader: logr, Canceller: a.canceller, Positions: a.positions(),
		Hold: a.drain.hold, Ended: a.requestEnded,
	})
	if err != nil {
		return err
	}
	if a.models, err = models.New(ModelsConfig(cfg), log.With("component", "models")); err != nil {
		return err
	}
	// Stops announced by DELETE on another process reach this one's
	// streams through the cancel channel the workers watch too.
	watcher, err := results.NewPublisher(cfg.QueuePrefix, rdb)
	if err != nil {
		return err
	}
	a.background = append(a.background, func(ctx context.Context) {
		cancels, err := watcher.WatchCancels(ctx)
		if err != nil {
			log.Error("cannot watch stops; DELETE reaches only local streams", "err", err)
			return
		}
		stop := context.AfterFunc(ctx, cancels.Close)
		defer stop()
		a.handler.WatchStops(cancels)
	})
	return nil
}

// positions is the queue's Positioner, or nil when there is no queue or
// it cannot tell positions (Kafka).
func (a *API) positions() failover.Positioner {
	if a.queue == nil {
		return nil
	}
	p, _ := a.queue.Queue.(failover.Positioner)
	return p
}

// buildStreamLog builds the per-request stream log (docs/API.md, "Resume
// and stop"), and a canceller for stops when there is no queue.
func (a *API) buildStreamLog() (*streamlog.Appender, *streamlog.Reader, error) {
	lc := StreamLogConfig(a.cfg)
	lc.OnDrop = a.obs.m.StreamLogDropped.Inc
	lc.Producer, lc.Liveness = a.name, streamLogLiveness(a.cfg)
	logw, err := streamlog.NewAppender(lc, a.rdb, a.log.With("component", "streamlog"))
	if err != nil {
		return nil, nil, err
	}
	// Run stops after the HTTP drain, once no stream appends any more.
	a.background = append(a.background, logw.Run)

	logr, err := streamlog.NewReader(a.cfg.QueuePrefix, a.rdb)
	if err != nil {
		return nil, nil, err
	}
	if a.canceller == nil {
		sub, err := results.NewSubscriber(ResultsConfig(a.cfg), a.rdb, a.log)
		if err != nil {
			return nil, nil, err
		}
		a.own = append(a.own, func() { _ = sub.Close() })
		a.canceller = sub
	}
	return logw, logr, nil
}

// buildQueued builds the queued path on the queue: result subscriber,
// gateway, overflow gate, and the in-process workers when configured.
func (a *API) buildQueued() (failover.Spiller, *admission.Overflow, error) {
	cfg, log, m, q := a.cfg, a.log, a.obs.m, a.queue
	a.ready = append(a.ready, q.Queue.Ping)
	sub, err := results.NewSubscriber(ResultsConfig(cfg), a.rdb, log)
	if err != nil {
		return nil, nil, err
	}
	a.own = append(a.own, func() { _ = sub.Close() })
	a.canceller = sub
	quota, err := admission.NewQuota(QuotaConfig(cfg), a.rdb)
	if err != nil {
		return nil, nil, err
	}
	a.background = append(a.background, func(ctx context.Context) {
		WatchPrimarySwitch(ctx, cfg, log, func(addr string) {
			log.Warn("redis primary switched; resubscribing result channels", "primary", addr)
			sub.Reset(fmt.Errorf("redis primary switched to %s", addr))
		})
	})
	gw, err := gateway.New(GatewayConfig(cfg), gateway.Deps{
		Producer: q.Queue, Results: sub, Canceller: sub, Quota: quota, Metrics: m, Log: log, Tracing: a.tel,
	})
	if err != nil {
		return nil, nil, err
	}
	// Quota releases still in flight finish before the Redis client closes.
	a.own = append(a.own, gw.Wait)
	overflow, err := admission.NewOverflow(OverflowConfig(cfg), q.Queue, m, log)
	if err != nil {
		return nil, nil, err
	}
	a.background = append(a.background, overflow.Run)
	if cfg.WorkersInProcess() {
		pub, err := results.NewPublisher(cfg.QueuePrefix, a.rdb)
		if err != nil {
			return nil, nil, err
		}
		w, err := worker.New(WorkerConfig(cfg), worker.Deps{
			Consumer: q.Consumer, Pool: a.pool, Provider: a.workerProvider(), Results: pub, Cancels: pub,
			Metrics: a.workerMetrics(), Log: log.With("component", "worker"), Tracing: a.tel, Ended: a.requestEnded,
		})
		if err != nil {
			return nil, nil, err
		}
		a.background = append(a.background, func(ctx context.Context) { _ = w.Run(ctx) })
	}
	return gw, overflow, nil
}

// Close releases what NewAPI built, newest first, then the shared
// dependencies and the clients.
func (a *API) Close() {
	for i := len(a.own) - 1; i >= 0; i-- {
		a.own[i]()
	}
	a.own = nil
	a.deps.close()
}

func (a *API) routes(metricsH http.Handler) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.HandleMethodNotAllowed = true
	// POST /v1/stream/ gets a 404 problem, not a 307 that a client would
	// follow by sending the body again, or not at all.
	e.RedirectTrailingSlash = false
	e.RedirectFixedPath = false
	// CORS first: refusals, 404/405 and panics must carry its headers too.
	if p := cors.New(cors.Config{AllowedOrigins: a.cfg.CORSAllowedOrigins}); p.Enabled() {
		e.Use(p.Gin())
	}
	// The server span of each request, continuing an incoming traceparent
	// (docs/TRACING.md); after CORS, so preflights are not traced, and
	// before recovery, so a panic still ends the span.
	e.Use(a.tel.GinMiddleware(telemetry.ServiceAPI))
	// A panic in a handler is a bug; the client still gets a problem
	// document, and the log gets the stack.
	e.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, err any) {
		a.log.Error("handler panicked", "path", c.Request.URL.Path, "panic", fmt.Sprint(err), "stack", string(debug.Stack()))
		stream.WriteProblem(c.Writer, protocol.RequestFailed(), c.Request.URL.Path)
		c.Abort()
	}))
	e.Use(limitHeaders)
	streamHandler := gin.WrapH(a.drain.guard(a.handler))
	e.POST("/v1/stream", streamHandler)
	e.POST("/stream", streamHandler)
	e.GET("/v1/streams/:id", func(c *gin.Context) { a.handler.Resume(c.Writer, c.Request, c.Param("id")) })
	e.DELETE("/v1/streams/:id", func(c *gin.Context) { a.handler.Stop(c.Writer, c.Request, c.Param("id")) })
	oa := stream.NewOpenAI(a.handler, alwaysListed(a.cfg))
	e.POST("/v1/chat/completions", gin.WrapF(oa.ChatCompletions))
	e.POST("/v1/responses", gin.WrapF(oa.Responses))
	e.POST("/v1/embeddings", gin.WrapF(oa.Embeddings))
	e.POST("/v1/completions", gin.WrapF(oa.Completions))
	e.GET("/v1/models", gin.WrapH(oa.Guard(http.HandlerFunc(a.models.ServeList))))
	// A catch-all: model ids may hold slashes (meta-llama/Llama-3.1-8B),
	// which the SDKs send as %2F and net/http decodes.
	e.GET("/v1/models/*id", gin.WrapH(oa.Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.models.ServeModel(w, r, strings.TrimPrefix(r.URL.Path, "/v1/models/"))
	}))))
	e.GET("/healthz", gin.WrapF(healthz))
	e.GET("/readyz", a.readyz)
	e.GET("/metrics", gin.WrapH(metricsH))
	if a.cfg.ChatPageEnabled {
		e.GET("/", gin.WrapH(web.Handler()))
	}
	e.NoRoute(func(c *gin.Context) {
		stream.WriteProblem(c.Writer, protocol.NotFound(), c.Request.URL.Path)
	})
	e.NoMethod(func(c *gin.Context) {
		stream.WriteProblem(c.Writer, protocol.MethodNotAllowed(c.Request.Method), c.Request.URL.Path)
	})
	return e
}

func (a *API) readyz(c *gin.Context) {
	// Not ready from the first moment of a drain, so a load balancer
	// stops sending requests while open streams finish.
	if a.drain.isDraining() {
		stream.WriteProblem(c.Writer, protocol.ShuttingDown(notReadyRetryAfter), c.Request.URL.Path)
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), readyTimeout)
	defer cancel()
	for _, check := range a.ready {
		if err := check(ctx); err != nil {
			a.log.Warn("not ready", "err", err)
			stream.WriteProblem(c.Writer, protocol.NotReady(notReadyRetryAfter), c.Request.URL.Path)
			return
		}
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}

// Serve answers on ln until ctx ends, then shuts down. Stop order, and
// why (docs/OPERATIONS.md, "Shutdown and drain"): /readyz turns 503 and
// new streams are refused at once, while the listener stays open so the
// load balancer sees it; open streams get SHUTDOWN_GRACE_SECONDS to
// finish; then Drain ends the rest with an `error` event (shutting-down),
// the listener closes, and after a short slack every connection is
// closed, half-sent bodies and stalled readers included. Only once every
// stream ended do the background components stop, since queued streams
// still open need the in-process workers. Close, after Serve, releases
// the queue and the Redis and Kafka clients, and last shuts the tracer
// provider down (bounded to 5s), so the spans every step before ended are
// flushed (docs/TRACING.md).
func (a *API) Serve(ctx context.Context, ln net.Listener) error {
	limited := newLimitListener(ln, a.cfg.MaxConnections)
	a.conns.Store(limited)
	srv := &http.Server{Handler: a.engine, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: a.cfg.HTTPIdleTimeout,
		MaxHeaderBytes: serverMaxHeaderBytes, ConnState: limited.connState}
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	for _, run := range a.background {
		background.Go(func() { run(bgCtx) })
	}
	err := a.serveHTTP(ctx, srv, limited)
	stopBackground()
	background.Wait()
	return err
}

// serveHTTP serves until ctx ends and drains the open streams.
func (a *API) serveHTTP(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("app: serve: %w", err)
	case <-ctx.Done():
	}
	grace := a.cfg.ShutdownGrace
	a.log.Info("shutting down: not ready, draining open streams", "grace", grace.String())
	idle := a.drain.begin()
	graceTimer := time.NewTimer(grace)
	select {
	case <-idle:
	case <-graceTimer.C:
	}
	graceTimer.Stop()
	a.handler.Drain()
	// Shutdown closes the listener and waits for the drained streams to
	// write their last event; Close then cuts whatever is left.
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeSlack)
	defer cancel()
	if err := srv.Shutdown(closeCtx); err != nil {
		a.log.Warn("closing every connection left after the grace", "err", err)
		_ = srv.Close()
	}
	// The server no longer sees the connections waiting streams took over
	// (stream.Handler.Cut): they get what is left of closeSlack to write
	// their last event, then they are cut too.
	streamsEnded := make(chan struct{})
	go func() {
		a.handler.Wait()
		close(streamsEnded)
	}()
	select {
	case <-streamsEnded:
	case <-closeCtx.Done():
		a.log.Warn("closing the connections of the streams still writing their last event")
		a.handler.Cut()
		<-streamsEnded
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("app: serve: %w", err)
	}
	return nil
}
