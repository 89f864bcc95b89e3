package app

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/stream"
)

// deadLetterReadTimeout bounds reading the dead-letter depth on a scrape.
const deadLetterReadTimeout = time.Second

// observability is a process's registry, its collectors and the gauges
// owned by other components, refreshed on each scrape (docs/OPERATIONS.md,
// "Metrics").
type observability struct {
	reg  *prometheus.Registry
	m    *metrics.Metrics
	pool pool.Pool
	// deadLetters, when set, is read for spillway_dead_letter_depth.
	deadLetters func(context.Context) (int64, error)
}

func newObservability() *observability {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &observability{reg: reg, m: metrics.New(reg)}
}

// watch makes scrapes report p's slots and, when deadLetters is set, the
// dead-letter depth.
func (o *observability) watch(p pool.Pool, deadLetters func(context.Context) (int64, error)) {
	o.pool, o.deadLetters = p, deadLetters
}

// gatherer refreshes the gauges owned by other components just before each
// scrape, so they cost nothing between scrapes.
func (o *observability) gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		if o.pool != nil {
			st := o.pool.Stats()
			o.m.PoolSlotsInUse.Set(float64(st.InUse))
			o.m.PoolSlotsCapacity.Set(float64(st.Capacity))
			o.m.PoolLimit.Set(float64(st.Effective()))
		}
		if o.deadLetters != nil {
			ctx, cancel := context.WithTimeout(context.Background(), deadLetterReadTimeout)
			if n, err := o.deadLetters(ctx); err == nil {
				o.m.DeadLetterDepth.Set(float64(n))
			}
			cancel()
		}
		return o.reg.Gather()
	})
}

// metricsHandler serves /metrics, in the OpenMetrics format when the
// scraper asks for it: only that format carries the trace-id exemplars
// (docs/TRACING.md). Under METRICS_AUTH=api-key a scrape without a key of
// API_KEYS gets the 401 problem a stream would.
func (o *observability) metricsHandler(cfg *config.Config) (http.Handler, error) {
	h := promhttp.HandlerFor(o.gatherer(), promhttp.HandlerOpts{EnableOpenMetrics: true})
	if cfg.MetricsAuth != config.MetricsAuthAPIKey {
		return h, nil
	}
	keys, err := identity.ParseKeys(cfg.APIKeys)
	if err != nil {
		return nil, fmt.Errorf("app: metrics: API_KEYS: %w", err)
	}
	ids := identity.NewResolver(identity.Config{Keys: keys})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := ids.Authenticate(r); p != nil {
			stream.WriteProblem(w, p, r.URL.Path)
			return
		}
		h.ServeHTTP(w, r)
	}), nil
}

// healthz answers /healthz: the process is up. Readiness (/readyz, api
// only) is what checks dependencies.
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}
