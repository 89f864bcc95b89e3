// Package app wires an api process together from its configuration: the
// provider, the pool, the queue pieces, the HTTP routes and the shutdown
// order. cmd/api and the end-to-end tests both build the api through it.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
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
}

// NewProvider builds the provider LLM_PROVIDER names.
func NewProvider(cfg *config.Config) (llm.Provider, error) {
	switch cfg.LLMProvider {
	case "sim":
		return llm.NewSim(SimConfig(cfg))
	case "openai":
		return llm.NewOpenAI(llm.OpenAIConfig{BaseURL: cfg.LLMBaseURL, APIKey: cfg.LLMAPIKey, Timeout: cfg.LLMTimeout()})
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

// NewAPI builds the api for cfg. It does no network I/O beyond what the
// queue and pool backends need to start; Close releases what it built.
func NewAPI(cfg *config.Config, log *slog.Logger, opts Options) (*API, error) {
	a := &API{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.m = metrics.New(a.reg)
	a.m.QueueThreshold.Set(float64(cfg.QueueOverflowThreshold))

	provider := opts.Provider
	if provider == nil {
		p, err := NewProvider(cfg)
		if err != nil {
			return nil, err
		}
		provider = p
	}
	p, err := pool.NewLocal(cfg.ConnectionPoolSize, cfg.ConnectionPoolPerUser)
	if err != nil {
		return nil, err
	}
	a.pool = p

	h, err := stream.New(stream.Config{
		MaxBodyBytes:      cfg.MaxBodyBytes,
		Limits:            protocol.Limits{MaxMessages: cfg.MaxMessages, MaxTokens: cfg.MaxTokensLimit},
		Heartbeat:         cfg.HeartbeatInterval(),
		DirectPathEnabled: cfg.DirectPathEnabled,
		APIKeys:           cfg.APIKeys,
	}, a.pool, provider, nil, a.m, log)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.handler = h
	a.engine = a.routes()
	return a, nil
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
	e.Use(gin.Recovery())
	streamHandler := gin.WrapH(a.handler)
	e.POST("/v1/stream", streamHandler)
	e.POST("/stream", streamHandler)
	e.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	e.GET("/readyz", a.readyz)
	e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(a.gatherer(), promhttp.HandlerOpts{})))
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
