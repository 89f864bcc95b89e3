package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/failover/worker"
)

// metricsStopTimeout bounds stopping the consumer's /metrics server.
const metricsStopTimeout = 5 * time.Second

// RunConsumer runs a standalone worker process until ctx ends: it takes
// jobs from the queue and serves /metrics and /healthz on
// CONSUMER_HTTP_ADDR. Stop order: on ctx end the worker stops fetching,
// lets running jobs finish within SHUTDOWN_GRACE_SECONDS and leaves the
// rest for takeover; then the background loops stop (the degradation
// figures of the last jobs flushed, the adaptive limit's reports); the
// metrics server stays up until then, so the last jobs are counted; then
// the queue, the pool and the clients close; the
// tracer provider shuts down last (bounded to 5s), flushing the spans of
// the last jobs (docs/TRACING.md).
func RunConsumer(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	d, err := newDeps(ctx, cfg, log, roleConsumer, Options{})
	if err != nil {
		return err
	}
	defer d.close()
	log = d.log // adds the trace ids of the job's span
	d.obs.watch(d.pool, nil)
	pub, err := results.NewPublisher(cfg.QueuePrefix, d.rdb)
	if err != nil {
		return err
	}
	w, err := worker.New(WorkerConfig(cfg), worker.Deps{
		Consumer: d.queue.Consumer, Pool: d.pool, Provider: d.workerProvider(), Results: pub, Cancels: pub,
		Metrics: d.workerMetrics(), Log: log, Tracing: d.tel, Ended: d.requestEnded,
	})
	if err != nil {
		return err
	}

	metricsH, err := d.obs.metricsHandler(cfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsH)
	mux.HandleFunc("GET /healthz", healthz)
	ln, err := net.Listen("tcp", cfg.ConsumerHTTPAddr)
	if err != nil {
		return fmt.Errorf("consumer: listen %s: %w", cfg.ConsumerHTTPAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	log.Info("consumer started", "name", d.name, "queue", cfg.QueueType, "concurrency", cfg.WorkerConcurrency, "http", ln.Addr().String(),
		"provider", cfg.LLMProvider, "upstreams", upstreamURLs(cfg), "pool_size", cfg.ConnectionPoolSize)

	// The background loops outlive the worker, so what its last jobs
	// reported is flushed.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var background sync.WaitGroup
	for _, run := range d.runs {
		background.Go(func() { run(bgCtx) })
	}
	err = w.Run(ctx)
	stopBackground()
	background.Wait()
	sctx, cancel := context.WithTimeout(context.Background(), metricsStopTimeout)
	defer cancel()
	_ = srv.Shutdown(sctx)
	wg.Wait()
	log.Info("consumer stopped")
	return err
}
