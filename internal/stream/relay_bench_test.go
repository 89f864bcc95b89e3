package stream_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
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
	prov, err := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: up.URL + "/v1"})
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
	for _, ep := range []struct {
		name, path, body string
		serve            http.HandlerFunc
	}{
		{"native", "/v1/stream", validBody, h.ServeHTTP},
		{"openai", "/v1/chat/completions", `{"model":"sim-1","stream":true,"messages":[{"role":"user","content":"hi"}]}`, oa.ChatCompletions},
	} {
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
