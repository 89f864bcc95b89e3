package app

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
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
// (docs/TRACING.md).
func (o *observability) metricsHandler() http.Handler {
	return promhttp.HandlerFor(o.gatherer(), promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// healthz answers /healthz: the process is up. Readiness (/readyz, api
// only) is what checks dependencies.
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
}
