package upstream

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestPrometheusNames(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	p, err := NewPrometheus(reg)
	if err != nil {
		t.Fatal(err)
	}
	p.InFlight("a:1", 3)
	p.Healthy("a:1", false)
	p.Request("a:1", OutcomeThrottled)
	p.FirstChunk("a:1", 40*time.Millisecond)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		m := mf.GetMetric()[0]
		switch {
		case m.Gauge != nil:
			got[mf.GetName()] = m.GetGauge().GetValue()
		case m.Counter != nil:
			got[mf.GetName()] = m.GetCounter().GetValue()
		case m.Histogram != nil:
			got[mf.GetName()] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	want := []string{"spillway_upstream_first_chunk_seconds", "spillway_upstream_healthy",
		"spillway_upstream_in_flight", "spillway_upstream_requests_total"}
	if !slices.Equal(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	if got["spillway_upstream_in_flight"] != 3 || got["spillway_upstream_healthy"] != 0 ||
		got["spillway_upstream_requests_total"] != 1 || got["spillway_upstream_first_chunk_seconds"] != 1 {
		t.Fatalf("values %v", got)
	}
	if _, err := NewPrometheus(reg); err == nil {
		t.Fatal("second registration on one registry accepted")
	}
}
