// The tests of package app are system tests: they start a real
// redis-server per test (internal/redistest), kfake Kafka brokers
// (internal/kafkatest) and simllm upstreams, serve the api and consumer on
// loopback ports, and procs_test.go builds cmd/api and cmd/consumer and
// runs them as separate processes. They run in `make test`; -short skips
// the ones that need redis-server.
package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// testLog discards logs unless -v is given.
func testLog(tb testing.TB) *slog.Logger {
	tb.Helper()
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(&tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return testutil.DiscardLogger()
}

type tbWriter struct{ tb testing.TB }

func (w *tbWriter) Write(b []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// startSimllm runs simllm's server in-process as a real HTTP upstream.
func startSimllm(tb testing.TB, sc llm.SimConfig) (*simserver.Server, string) {
	tb.Helper()
	sim, err := llm.NewSim(sc)
	if err != nil {
		tb.Fatal(err)
	}
	srv := simserver.New(sim, testLog(tb))
	ts := httptest.NewServer(srv)
	tb.Cleanup(ts.Close)
	return srv, ts.URL + "/v1"
}

// testConfig loads a config from env-style settings, as the process would.
func testConfig(tb testing.TB, env map[string]string) *config.Config {
	tb.Helper()
	cfg, err := config.Load("", env)
	if err != nil {
		tb.Fatalf("config: %v", err)
	}
	return cfg
}

// startAPI builds and serves an api on a loopback port. stop shuts it
// down gracefully and returns what Serve returned; it runs at the end of
// the test too, and only once.
func startAPI(tb testing.TB, cfg *config.Config) (a *API, url string, stop func() error) {
	tb.Helper()
	return startAPIWith(tb, cfg, Options{})
}

// startAPIWith is startAPI with opts.
func startAPIWith(tb testing.TB, cfg *config.Config, opts Options) (a *API, url string, stop func() error) {
	tb.Helper()
	a, err := NewAPI(cfg, testLog(tb), opts)
	if err != nil {
		tb.Fatalf("NewAPI: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	var once sync.Once
	var serveErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case serveErr = <-served:
			case <-time.After(30 * time.Second):
				serveErr = errors.New("api did not shut down within 30s")
			}
			a.Close()
		})
		return serveErr
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Error(err)
		}
	})
	return a, "http://" + ln.Addr().String(), stop
}

func postStream(tb testing.TB, ctx context.Context, url string, body any, hdr map[string]string) *http.Response {
	tb.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/stream", rd)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST: %v", err)
	}
	return resp
}

func prompt(text string) map[string]any {
	return map[string]any{"messages": []protocol.Message{{Role: "user", Content: text}}}
}

func userMsgs(text string) []protocol.Message {
	return []protocol.Message{{Role: "user", Content: text}}
}

// readProblem decodes a problem+json answer and checks its envelope.
func readProblem(tb testing.TB, resp *http.Response) protocol.Problem {
	tb.Helper()
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		tb.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p protocol.Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		tb.Fatalf("decode problem: %v", err)
	}
	if p.Status != resp.StatusCode {
		tb.Fatalf("problem status %d != HTTP %d", p.Status, resp.StatusCode)
	}
	if !strings.HasPrefix(p.Type, protocol.ProblemTypeBase) || p.Title == "" || p.Detail == "" || p.Instance == "" {
		tb.Fatalf("incomplete problem %+v", p)
	}
	return p
}
