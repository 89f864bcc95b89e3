package telemetry

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// ExemplarTraceID is the exemplar label that names the trace, the one
// Grafana's "exemplars" link follows to the trace store.
const ExemplarTraceID = "trace_id"

// ObserveWithExemplar observes v on o and, when ctx holds a sampled span and
// o supports exemplars (every client_golang histogram does), attaches the
// span's trace id as an exemplar, so a point on a latency panel leads to
// the trace of one request that took that long. Without a sampled span it
// is o.Observe(v), at no extra cost.
//
// Exemplars are only served in the OpenMetrics format: the /metrics handler
// needs promhttp.HandlerOpts{EnableOpenMetrics: true}, and the scraper asks
// for it (Prometheus does when started with
// --enable-feature=exemplar-storage).
func ObserveWithExemplar(ctx context.Context, o prometheus.Observer, v float64) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{ExemplarTraceID: sc.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}
