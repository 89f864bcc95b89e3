package telemetry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spillway-dev/spillway/internal/telemetry"
)

func TestObserveWithExemplar(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "spillway_time_to_first_chunk_seconds", Help: "h", Buckets: []float64{0.1, 1, 10},
	}, []string{"path"})
	reg.MustRegister(h)

	telemetry.ObserveWithExemplar(spanContext(true), h.WithLabelValues("direct"), 0.5)
	telemetry.ObserveWithExemplar(spanContext(false), h.WithLabelValues("queued"), 0.5)
	telemetry.ObserveWithExemplar(context.Background(), h.WithLabelValues("queued"), 5)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exemplars := map[string][]string{} // path → trace ids
	for _, m := range mfs[0].GetMetric() {
		path := m.GetLabel()[0].GetValue()
		if got := m.GetHistogram().GetSampleCount(); (path == "direct" && got != 1) || (path == "queued" && got != 2) {
			t.Errorf("path %s: %d observations", path, got)
		}
		for _, b := range m.GetHistogram().GetBucket() {
			if e := b.GetExemplar(); e != nil {
				for _, l := range e.GetLabel() {
					exemplars[path] = append(exemplars[path], l.GetName()+"="+l.GetValue())
				}
			}
		}
	}
	if got := exemplars["direct"]; len(got) != 1 || got[0] != "trace_id="+incomingTraceID {
		t.Errorf("direct exemplars %v, want the sampled span's trace id", got)
	}
	if got := exemplars["queued"]; len(got) != 0 {
		t.Errorf("queued exemplars %v from an unsampled span or none", got)
	}

	// Served only as OpenMetrics, and only when the handler allows it.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `# {trace_id="` + incomingTraceID + `"} 0.5`; !strings.Contains(string(body), want) {
		t.Errorf("OpenMetrics exposition lacks %q:\n%s", want, body)
	}
}
