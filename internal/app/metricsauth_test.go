package app

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// getMetrics fetches url with key as bearer (none when empty) and returns
// the response, its body read.
func getMetrics(t *testing.T, url, key string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// METRICS_AUTH=api-key: /metrics of the api and of the consumer answers
// only a bearer key of API_KEYS (a digest entry included), with the 401
// problem otherwise; METRICS_AUTH=none (the default) serves anyone, as
// before.
func TestMetricsAuth(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{
		"API_KEYS": "scrape-key,sha256:" + strings.Repeat("ab", 32), "METRICS_AUTH": "api-key",
	})
	_, url := c.api(nil)
	cons := c.consumer(nil)
	for _, target := range []string{url + "/metrics", "http://" + cons.addr + "/metrics"} {
		for _, key := range []string{"", "wrong-key"} {
			resp, body := getMetrics(t, target, key)
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(body, protocol.ProblemUnauthorized) || strings.Contains(body, "spillway_") {
				t.Fatalf("%s with key %q: HTTP %d %q, want the 401 problem", target, key, resp.StatusCode, body)
			}
		}
		resp, body := getMetrics(t, target, "scrape-key")
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "spillway_pool_slots_capacity") {
			t.Fatalf("%s with the key: HTTP %d, want the metrics", target, resp.StatusCode)
		}
	}
	// /healthz stays open: liveness probes carry no key.
	if resp, _ := getMetrics(t, url+"/healthz", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: HTTP %d", resp.StatusCode)
	}

	open := newCluster(t, fastSim(), map[string]string{"API_KEYS": "k"})
	_, openURL := open.api(nil)
	if resp, body := getMetrics(t, openURL+"/metrics", ""); resp.StatusCode != http.StatusOK || !strings.Contains(body, "spillway_") {
		t.Fatalf("METRICS_AUTH unset: HTTP %d, want the metrics without a key", resp.StatusCode)
	}
}
