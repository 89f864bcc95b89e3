package upstream

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// mockUpstream is an OpenAI-compatible server that counts its calls and
// the most it ever had in flight at once.
type mockUpstream struct {
	srv        *httptest.Server
	status     atomic.Int32  // 0 or 200: stream; else answer this status
	retryAfter atomic.Value  // string Retry-After with status 429
	delay      atomic.Int64  // ns before the first chunk
	hold       chan struct{} // when not nil, each call waits on it before answering

	calls, inFlight, peak, probes atomic.Int64
}

func newMock(tb testing.TB) *mockUpstream {
	tb.Helper()
	m := &mockUpstream{}
	m.retryAfter.Store("")
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	tb.Cleanup(m.srv.Close)
	return m
}

func (m *mockUpstream) url() string { return m.srv.URL + "/v1" }

func (m *mockUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		m.probes.Add(1)
		if s := m.status.Load(); s != 0 && s != 200 {
			w.WriteHeader(int(s))
			return
		}
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	m.calls.Add(1)
	n := m.inFlight.Add(1)
	defer m.inFlight.Add(-1)
	for {
		p := m.peak.Load()
		if n <= p || m.peak.CompareAndSwap(p, n) {
			break
		}
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if s := m.status.Load(); s != 0 && s != 200 {
		if ra, _ := m.retryAfter.Load().(string); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(int(s))
		return
	}
	if m.hold != nil {
		select {
		case <-m.hold:
		case <-r.Context().Done():
			return
		}
	}
	if d := time.Duration(m.delay.Load()); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, c := range []string{"hel", "lo"} {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", c)
		w.(http.Flusher).Flush()
	}
	_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
}

func openAIProvider(s Spec) (llm.Provider, error) {
	return llm.NewOpenAI(llm.OpenAIConfig{BaseURL: s.BaseURL, APIKey: s.APIKey})
}

// countingMetrics records what the Balancer reports.
type countingMetrics struct {
	mu       sync.Mutex
	requests map[string]int // "upstream/outcome"
	healthy  map[string]bool
	first    map[string]int
}

func newCountingMetrics() *countingMetrics {
	return &countingMetrics{requests: map[string]int{}, healthy: map[string]bool{}, first: map[string]int{}}
}

func (c *countingMetrics) InFlight(string, int) {}
func (c *countingMetrics) Healthy(u string, h bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.healthy[u] = h
}
func (c *countingMetrics) Request(u, o string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests[u+"/"+o]++
}
func (c *countingMetrics) FirstChunk(u string, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.first[u]++
}
func (c *countingMetrics) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests[key]
}
func (c *countingMetrics) isHealthy(u string) (bool, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.healthy[u]
	return h, ok
}

// logBuffer collects log lines for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testLogger(buf *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func chat(content string) protocol.ChatRequest {
	return protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: content}}, MaxTokens: 16}
}

// collect streams req through p and returns the text.
func collect(ctx context.Context, p llm.Provider, req protocol.ChatRequest) (string, error) {
	var sb strings.Builder
	_, err := p.Stream(ctx, req, func(chunk protocol.Chunk) error {
		s := chunk.Content
		sb.WriteString(s)
		return nil
	})
	return sb.String(), err
}

// fakeUps builds router inputs with the given weights and loads.
func fakeUps(weights ...int) []*Upstream {
	ups := make([]*Upstream, len(weights))
	for i, w := range weights {
		name := fmt.Sprintf("u%d", i)
		ups[i] = &Upstream{Spec: Spec{Name: name, Weight: w}, index: i, nameHash: fnv64(name)}
	}
	return ups
}

func all(n int) uint64 { return 1<<n - 1 }
