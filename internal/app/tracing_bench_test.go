package app

import (
	"bufio"
	"bytes"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/testkit/oteltest"
)

// BenchmarkDirectTracing measures what tracing at 100% sampling costs one
// direct-path stream (docs/BENCHMARKS.md): "off" has no OTLP endpoint,
// "on" exports every span to an OTLP/HTTP receiver in this process. Each
// iteration is one whole stream of 16 tokens, read to its end; it reports
// the first-chunk latency (p50, p99 in µs) and the CPU time of this
// process per stream (api, client, simllm upstream and, when on, the
// receiver decoding the spans).
func BenchmarkDirectTracing(b *testing.B) {
	sc := llm.SimConfig{Tokens: 16, Seed: 1}
	_, upstream := startSimllm(b, sc)
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
			if on {
				rcv := oteltest.NewHTTP(b)
				b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.Endpoint)
				b.Setenv("OTEL_TRACES_SAMPLER", "always_on")
			}
			_, url, _ := startAPI(b, testConfig(b, directEnv(upstream, map[string]string{
				"CONNECTION_POOL_SIZE": "64", "CONNECTION_POOL_PER_USER": "64", "QUEUE_FAILOVER_ENABLED": "false",
			})))
			body := []byte(`{"prompt":"bench"}`)
			first := make([]time.Duration, 0, b.N)
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/stream", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				sc := bufio.NewScanner(resp.Body)
				gotFirst, done := false, false
				for sc.Scan() {
					line := sc.Text()
					if !gotFirst && strings.HasPrefix(line, "data: ") {
						gotFirst = true
						first = append(first, time.Since(t0))
					}
					if line == "event: done" {
						done = true
					}
				}
				resp.Body.Close()
				if !done {
					b.Fatal("stream did not end with done")
				}
			}
			b.StopTimer()
			cpu := cpuTime() - cpu0
			slices.Sort(first)
			b.ReportMetric(float64(first[len(first)/2].Microseconds()), "first-p50-µs")
			b.ReportMetric(float64(first[len(first)*99/100].Microseconds()), "first-p99-µs")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/stream")
		})
	}
}

// cpuTime is the user and system CPU time this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
