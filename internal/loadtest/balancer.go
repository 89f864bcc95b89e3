package loadtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"
)

// Balancer is the small load balancer of the scale-out benchmark: a
// reverse proxy that sends each request to the backend with the fewest
// requests in flight (ties in turn) and passes every response on as it
// arrives, as nginx does with least_conn and proxy_buffering off in front
// of several api processes (configs/nginx.conf). Safe for concurrent use.
type Balancer struct {
	backends []*backend
	next     atomic.Uint64
}

type backend struct {
	proxy  *httputil.ReverseProxy
	active atomic.Int64
}

// NewBalancer returns a Balancer over backends, each an http URL of an
// api process ("http://127.0.0.1:8080"); a request's path and query are
// kept.
func NewBalancer(backends []string) (*Balancer, error) {
	if len(backends) == 0 {
		return nil, errors.New("loadtest: balancer: no backends")
	}
	// One transport for all: idle connections are kept per host, enough of
	// them for every stream in flight of a benchmark run.
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	b := &Balancer{}
	for _, raw := range backends {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("loadtest: balancer: backend %q is not an http URL", raw)
		}
		b.backends = append(b.backends, &backend{proxy: &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(u)
				pr.SetXForwarded()
				pr.Out.Host = pr.In.Host
			},
			Transport: tr,
			// Every write of the backend goes out at once: SSE events
			// must not wait in a buffer.
			FlushInterval: -1,
			ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				http.Error(w, "balancer: backend unreachable", http.StatusBadGateway)
			},
		}})
	}
	return b, nil
}

// maxBalancedBody bounds a request body the Balancer buffers.
const maxBalancedBody = 8 << 20

// ServeHTTP proxies r to the least busy backend. The body is read whole
// first, as nginx does by default (proxy_request_buffering on): passed
// through as a stream, it made the backend connection close under a
// streaming answer now and then (seen in the tests).
func (b *Balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBalancedBody+1))
	switch {
	case err != nil:
		http.Error(w, "balancer: read body", http.StatusBadRequest)
		return
	case len(body) > maxBalancedBody:
		http.Error(w, "balancer: body too large", http.StatusRequestEntityTooLarge)
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	be := b.pick()
	be.active.Add(1)
	defer be.active.Add(-1)
	be.proxy.ServeHTTP(w, r)
}

// pick returns the backend with the fewest requests in flight, looking
// from the next one in turn so that ties rotate.
func (b *Balancer) pick() *backend {
	start := int(b.next.Add(1) % uint64(len(b.backends)))
	best := b.backends[start]
	for i := 1; i < len(b.backends); i++ {
		be := b.backends[(start+i)%len(b.backends)]
		if be.active.Load() < best.active.Load() {
			best = be
		}
	}
	return best
}

// InFlight returns each backend's requests in flight, in the order given
// to NewBalancer.
func (b *Balancer) InFlight() []int64 {
	out := make([]int64, len(b.backends))
	for i, be := range b.backends {
		out[i] = be.active.Load()
	}
	return out
}
