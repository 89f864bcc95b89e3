package app

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// BenchmarkTimeToFirstChunk compares the time to the first chunk of a
// stream taken straight from simllm (the upstream, through the OpenAI
// client) with one taken through the api's direct path in front of the
// same simllm. The difference is what the api adds. Both report p50 and
// p99 in µs besides ns/op.
func BenchmarkTimeToFirstChunk(b *testing.B) {
	sc := llm.SimConfig{Tokens: 4, Seed: 1}
	_, upstream := startSimllm(b, sc)
	b.Run("upstream", func(b *testing.B) {
		client, err := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: upstream})
		if err != nil {
			b.Fatal(err)
		}
		req := protocol.ChatRequest{Messages: userMsgs("bench")}
		errFirst := context.Canceled
		measure(b, func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, _ = client.Stream(ctx, req, func(protocol.Chunk) error { return errFirst })
		})
	})
	b.Run("api-direct", func(b *testing.B) {
		_, url, _ := startAPI(b, testConfig(b, directEnv(upstream, map[string]string{
			"CONNECTION_POOL_SIZE": "64", "CONNECTION_POOL_PER_USER": "64", "QUEUE_FAILOVER_ENABLED": "false",
		})))
		body := []byte(`{"prompt":"bench"}`)
		measure(b, func() {
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/stream", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data: ") {
					return // first chunk
				}
			}
			b.Fatal("no chunk")
		})
	})
}

// measure runs one stream per iteration and reports latency percentiles.
func measure(b *testing.B, one func()) {
	b.Helper()
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		one()
		samples = append(samples, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds()), "p99-µs")
}
