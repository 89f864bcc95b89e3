package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/metrics"
)

// RunConsumer runs a standalone worker process until ctx ends: it takes
// jobs from the queue and serves /metrics and /healthz on
// CONSUMER_HTTP_ADDR. On ctx end it stops fetching, lets running jobs
// finish within SHUTDOWN_GRACE_SECONDS and leaves the rest for takeover.
func RunConsumer(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if cfg.Embedded() {
		return errors.New("consumer: REDIS_URL is required (the consumer has no embedded mode)")
	}
	opts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("consumer: REDIS_URL: %w", err)
	}
	opts.PoolSize = max(opts.PoolSize, 2*cfg.WorkerConcurrency+8)
	opts.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	upstream, err := NewProvider(cfg)
	if err != nil {
		return err
	}
	provider, err := admission.NewBreaker(admission.DefaultBreakerConfig(), upstream, m, log)
	if err != nil {
		return err
	}
	p, closePool, err := NewPool(cfg, rdb, m, log, "consumer")
	if err != nil {
		return err
	}
	// The pool's leases go before the client closes (defers run in
	// reverse order).
	defer closePool()
	name := InstanceName("consumer")
	oq, err := OpenQueue(ctx, cfg, rdb, log, name)
	if err != nil {
		return err
	}
	// Leaves the consumer group after the worker settled its jobs, before
	// the pool and the Redis client close (defers run in reverse order).
	defer oq.Close()
	w, err := failover.NewWorker(WorkerConfig(cfg), oq.Consumer, p, provider, rdb, m, log)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		st := p.Stats()
		m.PoolSlotsInUse.Set(float64(st.InUse))
		m.PoolSlotsCapacity.Set(float64(st.Capacity))
		return reg.Gather()
	}), promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	ln, err := net.Listen("tcp", cfg.ConsumerHTTPAddr)
	if err != nil {
		return fmt.Errorf("consumer: listen %s: %w", cfg.ConsumerHTTPAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	log.Info("consumer started", "name", name, "queue", cfg.QueueType, "concurrency", cfg.WorkerConcurrency, "http", ln.Addr().String(),
		"provider", cfg.LLMProvider, "pool_size", cfg.ConnectionPoolSize)

	err = w.Run(ctx)
	// Metrics stay up until the worker has settled its jobs.
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	wg.Wait()
	log.Info("consumer stopped")
	return err
}
