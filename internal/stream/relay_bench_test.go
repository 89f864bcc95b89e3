package stream_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// BenchmarkDirectRelay is the direct path's cost per chunk, from the
// upstream's bytes to the client's, for both endpoints: an answer of 200
// chunks from an in-process upstream through the OpenAI client, the
// producer, the write loop and the writer. Its ns/chunk is the figure
// docs/BENCHMARKS.md compares before and after the transparent proxy
// (relaying the raw chunk against decoding and encoding it again).
func BenchmarkDirectRelay(b *testing.B) {
	const chunks = 200
	body := sseAnswer(chunks)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(body)
	}))
	defer up.Close()
	for _, ep := range relayEndpoints(b, up.URL) {
		b.Run(ep.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, ep.path, strings.NewReader(ep.body))
				r.Header.Set("Content-Type", "application/json")
				w := &countingResponse{h: http.Header{}}
				ep.serve(w, r)
				if w.bytes < chunks*len(" tokN") {
					b.Fatalf("%d bytes: not a whole answer", w.bytes)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
		})
	}
}

// relayEndpoint is one dialect's route into a direct-path handler.
type relayEndpoint struct {
	name, path, body string
	serve            http.HandlerFunc
}

// relayEndpoints builds a direct-path handler (a pool that never fills,
// no log, an OpenAI provider at upstream) and returns its two dialects'
// routes.
func relayEndpoints(b *testing.B, upstream string) []relayEndpoint {
	b.Helper()
	prov, err := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: upstream + "/v1"})
	if err != nil {
		b.Fatal(err)
	}
	h, err := stream.New(stream.Config{MaxBodyBytes: 1024, Limits: protocol.DefaultLimits, Heartbeat: time.Hour,
		DirectPathEnabled: true, ResumeWindow: 0},
		stream.Deps{Pool: &fakePool{free: 1 << 30}, Provider: prov, Log: testutil.DiscardLogger(), LogWriter: &discardLog{}})
	if err != nil {
		b.Fatal(err)
	}
	oa := stream.NewOpenAI(h, []string{"sim-1"})
	return []relayEndpoint{
		{"native", "/v1/stream", validBody, h.ServeHTTP},
		{"openai", "/v1/chat/completions", `{"model":"sim-1","stream":true,"messages":[{"role":"user","content":"hi"}]}`, oa.ChatCompletions},
	}
}

// BenchmarkDirectRelayPaced is the direct path's CPU per chunk when the
// upstream paces its answer: every chunk its own write and flush upstream,
// pacedGap apart, so every chunk wakes the api's reader on its own (the
// parity bench's paced runs, at a shorter gap). pacedStreams answers run
// at once; cpu-ns/chunk is the process's user + system CPU per relayed
// chunk (the in-process upstream's included: the same for any tree).
func BenchmarkDirectRelayPaced(b *testing.B) {
	const (
		chunks       = 40
		pacedGap     = 2 * time.Millisecond
		pacedStreams = 50
	)
	enc := openaiwire.NewChunkEncoder("up-1", "sim-1", 1700000000)
	events := make([][]byte, 0, chunks+1)
	for i := range chunks {
		events = append(events, enc.AppendContent(nil, fmt.Sprintf(" tok%d\n", i), i == 0))
	}
	events = append(events, append(enc.AppendFinish(nil, "stop"), openaiwire.DoneFrame...))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i, ev := range events {
			if i > 0 {
				time.Sleep(pacedGap) // the upstream's pace, not a wait for a condition
			}
			if _, err := w.Write(ev); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}))
	defer up.Close()
	for _, ep := range relayEndpoints(b, up.URL) {
		b.Run(ep.name, func(b *testing.B) {
			cpu0 := processCPU(b)
			for b.Loop() {
				var wg sync.WaitGroup
				var short atomic.Int64
				for range pacedStreams {
					wg.Go(func() {
						r := httptest.NewRequest(http.MethodPost, ep.path, strings.NewReader(ep.body))
						r.Header.Set("Content-Type", "application/json")
						w := &countingResponse{h: http.Header{}}
						ep.serve(w, r)
						if w.bytes < chunks*len(" tokN") {
							short.Add(1)
						}
					})
				}
				wg.Wait()
				if n := short.Load(); n > 0 {
					b.Fatalf("%d answers short: not whole", n)
				}
			}
			relayed := float64(b.N * pacedStreams * chunks)
			b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/relayed, "cpu-ns/chunk")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/relayed, "ns/chunk")
		})
	}
}

// processCPU is the process's user + system CPU time so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
