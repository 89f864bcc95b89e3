// Command passproxy is the floor the benchmarks measure the api against:
// a bare HTTP pass-through hop (net/http/httputil.ReverseProxy, flushing
// every write of the upstream at once, connections kept alive), with no
// pool, no queue, no parsing and no re-encoding. What the api adds on top
// of it is the api's own cost (docs/bench-history/2026-11.md, "The floor: a bare
// pass-through hop").
//
//	passproxy -addr 127.0.0.1:9000 -upstream http://127.0.0.1:8081
package main

import (
	"bytes"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	upstream := flag.String("upstream", "http://127.0.0.1:8081", "upstream base URL")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		log.Fatalf("passproxy: bad -upstream %q", *upstream)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		// Every write of the upstream is flushed at once, as the api does.
		FlushInterval: -1,
		// The same connection reuse as the api's provider client.
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
	// The body is read whole before the upstream call, as the api reads
	// it: forwarded as it streams in, the transport could still be
	// reading it when the answer's first flush closes it (net/http ends
	// a request body once the response has started), and would drop the
	// upstream connection mid-answer.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	})
	srv := &http.Server{Addr: *addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
