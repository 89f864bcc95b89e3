package upstream

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome label values of spillway_upstream_requests_total.
const (
	OutcomeOK        = "ok"
	OutcomeError     = "error"
	OutcomeThrottled = "throttled"
	OutcomeTimeout   = "timeout"
)

// Metrics receives per-upstream observations. Implementations are safe for
// concurrent use and must not block: they are called on the request path.
type Metrics interface {
	// InFlight sets this process's calls in flight on upstream.
	InFlight(upstream string, n int)
	// Healthy says whether upstream takes its share (true) or sits out.
	Healthy(upstream string, healthy bool)
	// Request counts one finished call by outcome (Outcome* constants).
	Request(upstream, outcome string)
	// FirstChunk observes the time from sending a call to its first chunk.
	FirstChunk(upstream string, d time.Duration)
}

// NopMetrics discards every observation; it is the default.
type NopMetrics struct{}

var _ Metrics = NopMetrics{}

// InFlight does nothing.
func (NopMetrics) InFlight(string, int) {}

// Healthy does nothing.
func (NopMetrics) Healthy(string, bool) {}

// Request does nothing.
func (NopMetrics) Request(string, string) {}

// FirstChunk does nothing.
func (NopMetrics) FirstChunk(string, time.Duration) {}

// Prometheus exports the per-upstream metrics of docs/METRICS.md:
// spillway_upstream_in_flight{upstream}, spillway_upstream_healthy{upstream},
// spillway_upstream_requests_total{upstream,outcome},
// spillway_upstream_first_chunk_seconds{upstream} and, set by whoever runs
// adaptive concurrency per upstream, spillway_upstream_effective_limit{upstream}.
type Prometheus struct {
	limit      *prometheus.GaugeVec
	inFlight   *prometheus.GaugeVec
	healthy    *prometheus.GaugeVec
	requests   *prometheus.CounterVec
	firstChunk *prometheus.HistogramVec
}

var _ Metrics = (*Prometheus)(nil)

// firstChunkBuckets span a warm local replica (tens of ms) to a cold
// hosted model (a minute).
var firstChunkBuckets = []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// NewPrometheus creates the collectors and registers them on reg. It fails
// when reg already holds collectors of these names.
func NewPrometheus(reg prometheus.Registerer) (*Prometheus, error) {
	p := &Prometheus{
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spillway_upstream_effective_limit", Help: "Calls at once each capped upstream allows now: its max_concurrency, lowered by adaptive concurrency (cluster-wide with the Redis pool).",
		}, []string{"upstream"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spillway_upstream_in_flight", Help: "Calls in flight on each upstream from this process.",
		}, []string{"upstream"}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "spillway_upstream_healthy", Help: "1 while the upstream takes its share, 0 while it sits out.",
		}, []string{"upstream"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "spillway_upstream_requests_total", Help: "Calls to each upstream by outcome (ok, error, throttled, timeout).",
		}, []string{"upstream", "outcome"}),
		firstChunk: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "spillway_upstream_first_chunk_seconds", Help: "Time from sending a call to its first chunk, by upstream.",
			Buckets: firstChunkBuckets,
		}, []string{"upstream"}),
	}
	for _, c := range []prometheus.Collector{p.limit, p.inFlight, p.healthy, p.requests, p.firstChunk} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Limit sets spillway_upstream_effective_limit.
func (p *Prometheus) Limit(upstream string, n int) {
	p.limit.WithLabelValues(upstream).Set(float64(n))
}

// InFlight sets spillway_upstream_in_flight.
func (p *Prometheus) InFlight(upstream string, n int) {
	p.inFlight.WithLabelValues(upstream).Set(float64(n))
}

// Healthy sets spillway_upstream_healthy to 1 or 0.
func (p *Prometheus) Healthy(upstream string, healthy bool) {
	v := 0.0
	if healthy {
		v = 1
	}
	p.healthy.WithLabelValues(upstream).Set(v)
}

// Request counts spillway_upstream_requests_total.
func (p *Prometheus) Request(upstream, outcome string) {
	p.requests.WithLabelValues(upstream, outcome).Inc()
}

// FirstChunk observes spillway_upstream_first_chunk_seconds.
func (p *Prometheus) FirstChunk(upstream string, d time.Duration) {
	p.firstChunk.WithLabelValues(upstream).Observe(d.Seconds())
}
