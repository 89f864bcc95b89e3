package loadtest

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

func seq(from, to int) []time.Duration {
	var d []time.Duration
	for i := from; i <= to; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	return d
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value p50", []time.Duration{7 * ms}, 50, 7 * ms},
		{"one value p99", []time.Duration{7 * ms}, 99, 7 * ms},
		{"1..100 p50", seq(1, 100), 50, 50 * ms},
		{"1..100 p90", seq(1, 100), 90, 90 * ms},
		{"1..100 p99", seq(1, 100), 99, 99 * ms},
		{"1..100 p100", seq(1, 100), 100, 100 * ms},
		{"1..10 p50", seq(1, 10), 50, 5 * ms},
		{"1..10 p90", seq(1, 10), 90, 9 * ms},
		{"1..10 p99", seq(1, 10), 99, 10 * ms},
		{"1..1000 p99", seq(1, 1000), 99, 990 * ms},
		{"1..1000 p50", seq(1, 1000), 50, 500 * ms},
		{"two values p50", seq(1, 2), 50, 1 * ms},
		{"two values p51", seq(1, 2), 51, 2 * ms},
		{"tiny p", seq(1, 10), 0.001, 1 * ms},
	}
	for _, tt := range tests {
		if got := percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("%s: percentile(p%v) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
}

func TestSamplerPercentiles(t *testing.T) {
	t.Parallel()
	s := newSampler(1)
	// Added out of order: percentiles must sort.
	for _, d := range seq(1, 100) {
		s.add(101*time.Millisecond - d)
	}
	got := s.percentiles()
	want := Percentiles{P50: 50, P90: 90, P99: 99, Max: 100}
	if got != want {
		t.Errorf("percentiles = %+v, want %+v", got, want)
	}
}

func TestSamplerBounded(t *testing.T) {
	t.Parallel()
	s := newSampler(1)
	for i := range maxSamples + 1000 {
		s.add(time.Duration(i % 1000))
	}
	s.add(time.Hour)
	if len(s.vals) != maxSamples || s.seen != maxSamples+1001 || s.max != time.Hour {
		t.Errorf("kept %d, seen %d, max %v", len(s.vals), s.seen, s.max)
	}
}

func TestResultOutput(t *testing.T) {
	t.Parallel()
	res := &Result{
		URL: "http://127.0.0.1:8080/v1/stream", Elapsed: 1.5, Requests: 10,
		Done: 5, Errors: 1, Refused: 1, Disconnected: 1, Lost: 2,
		ErrorsByType: map[string]int{"https://spillway.dev/errors/worker-lost": 1},
		RefusedBy:    []Refusal{{Status: 503, Type: "https://spillway.dev/errors/queue-overflow", Count: 1, RetryAfterMin: 60, RetryAfterMax: 60}},
		LostByReason: map[LostReason]int{ReasonNoTerminal: 2},
		LostSamples:  []string{"request 3: no-terminal: stream ended"},
		Paths:        map[string]int{"direct": 8},
		Latency:      map[string]PathLatency{"direct": {Count: 5, FirstChunk: Percentiles{P50: 12.5}}},
		Pings:        3,
		PingInterval: Percentiles{P50: 2001.5, P99: 2003, Max: 2004},
		MaxGap:       Percentiles{P50: 2002.5, Max: 2004},
	}
	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]float64{"lost": 2, "done": 5, "refused": 1, "disconnected": 1, "requests": 10} {
		if got, ok := m[key].(float64); !ok || got != want {
			t.Errorf("json %q = %v, want %v", key, m[key], want)
		}
	}
	var back Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Latency["direct"].FirstChunk.P50 != 12.5 ||
		back.LostByReason[ReasonNoTerminal] != 2 || back.RefusedBy[0].RetryAfterMax != 60 ||
		back.PingInterval.P99 != 2003 || back.MaxGap.P50 != 2002.5 {
		t.Errorf("round trip %+v, %v", back, err)
	}

	var tab bytes.Buffer
	if err := res.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	out := tab.String()
	if !regexp.MustCompile(`(?m)^lost +2 `).MatchString(out) {
		t.Errorf("table lacks the lost count:\n%s", out)
	}
	for _, want := range []string{"no-terminal", "503 https://spillway.dev/errors/queue-overflow (Retry-After 60-60s)",
		"worker-lost", "12.5ms", "request 3: no-terminal", "2001.5ms", "2002.5ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
