package app

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// ServePprof serves the profile index on its own listener and stops.
func TestServePprof(t *testing.T) {
	t.Parallel()
	addr, stop, err := ServePprof("127.0.0.1:0", testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine") {
		t.Fatalf("pprof index: %d", resp.StatusCode)
	}
	stop()
	if _, err := http.Get("http://" + addr + "/debug/pprof/"); err == nil {
		t.Fatal("pprof still serving after stop")
	}
	if _, _, err := ServePprof("256.0.0.1:1", testLog(t)); err == nil {
		t.Fatal("bad address accepted")
	}
}

// The api's own routes do not expose profiles.
func TestAPIDoesNotServePprof(t *testing.T) {
	t.Parallel()
	_, upstream := startSimllm(t, fastSim())
	_, url, _ := startAPI(t, testConfig(t, directEnv(upstream, nil)))
	resp, err := http.Get(url + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || strings.Contains(string(body), "goroutine") {
		t.Fatalf("api answered /debug/pprof/ with %d", resp.StatusCode)
	}
}
