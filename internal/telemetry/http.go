package telemetry

import (
	"net/http"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// untracedRoutes are the api's own plumbing: a scrape or probe every few
// seconds would drown the requests in the trace store.
var untracedRoutes = map[string]bool{"/metrics": true, "/healthz": true, "/readyz": true}

// GinMiddleware returns the middleware that starts the server span of each
// request (otelgin): it continues an incoming W3C traceparent, or starts a
// new trace, and puts the span in c.Request.Context() for the handler.
// service is the server name the span reports (the service name). The
// probe and metrics routes get no span. With tracing off it only calls
// c.Next.
func (p *Provider) GinMiddleware(service string) gin.HandlerFunc {
	if !p.Enabled() {
		return func(c *gin.Context) { c.Next() }
	}
	return otelgin.Middleware(service,
		otelgin.WithTracerProvider(p.tp),
		otelgin.WithPropagators(p.prop),
		// Spillway's metrics are Prometheus ones; no OTel meter here.
		otelgin.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgin.WithGinFilter(func(c *gin.Context) bool { return !untracedRoutes[c.FullPath()] }),
	)
}

// HTTPTransport wraps base, the transport of the client that calls the
// OpenAI-compatible upstream, so every request sends the W3C traceparent of
// its context and gets an HTTP client span (otelhttp) under the
// "chat {model}" span. With tracing off it returns base itself. A nil base
// means http.DefaultTransport.
func (p *Provider) HTTPTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if !p.Enabled() {
		return base
	}
	return otelhttp.NewTransport(base,
		otelhttp.WithTracerProvider(p.tp),
		otelhttp.WithPropagators(p.prop),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
	)
}
