package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		code int
	}{
		{"defaults", nil, 0},
		{"loopback v4", []string{"-url", "http://127.0.0.2:9000/v1/stream"}, 0},
		{"loopback v6", []string{"-url", "http://[::1]:8080/v1/stream"}, 0},
		{"localhost", []string{"-url", "http://LocalHost:8080/v1/stream"}, 0},
		{"remote name", []string{"-url", "http://example.com/v1/stream"}, 2},
		{"remote ip", []string{"-url", "http://10.0.0.1:8080/v1/stream"}, 2},
		{"name ending in localhost", []string{"-url", "http://localhost.example.com/v1/stream"}, 2},
		{"remote allowed", []string{"-allow-remote", "-url", "https://example.com/v1/stream"}, 0},
		{"unknown flag", []string{"-bogus"}, 2},
		{"bad share", []string{"-disconnect", "2"}, 2},
		{"unbounded", []string{"-n", "0"}, 2},
		{"extra argument", []string{"now"}, 2},
		{"bad header", []string{"-H", "NoColon"}, 2},
		{"openai mode", []string{"-mode", "openai", "-url", "http://127.0.0.1:8081/v1/chat/completions"}, 0},
		{"unknown mode", []string{"-mode", "grpc"}, 2},
		{"negative ramp", []string{"-ramp", "-1s"}, 2},
		{"help", []string{"-h"}, 0},
		{"balancer", []string{"-balance", "127.0.0.1:9000", "-backends", "http://127.0.0.1:8080, http://127.0.0.1:8081"}, 0},
		{"balancer without backends", []string{"-balance", "127.0.0.1:9000"}, 2},
		{"backends without balancer", []string{"-backends", "http://127.0.0.1:8080"}, 2},
		{"balancer on a remote address", []string{"-balance", "10.0.0.1:9000", "-backends", "http://127.0.0.1:8080"}, 2},
		{"remote backend", []string{"-balance", "127.0.0.1:9000", "-backends", "http://10.0.0.1:8080"}, 2},
		{"backend not a URL", []string{"-balance", "127.0.0.1:9000", "-backends", "127.0.0.1:8080"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseFlags(tt.args, io.Discard)
			if got := exitCode(err); got != tt.code {
				t.Errorf("exit code %d (%v), want %d", got, err, tt.code)
			}
		})
	}
}

func TestParseFlagsValues(t *testing.T) {
	t.Parallel()
	o, err := parseFlags([]string{"-c", "3", "-n", "7", "-d", "2s", "-think", "5ms", "-disconnect", "0.2",
		"-slow", "0.1", "-slow-delay", "3ms", "-prompts", "4", "-seed", "9", "-tokens", "12", "-verify=false",
		"-max-tokens", "5", "-users", "6", "-timeout", "9s", "-H", "Authorization: Bearer k", "-json",
		"-cpuprofile", "cpu.out", "-mode", "openai", "-model", "m-1", "-ramp", "3s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.cfg
	if c.Concurrency != 3 || c.Requests != 7 || c.Duration != 2*time.Second || c.ThinkTime != 5*time.Millisecond ||
		c.DisconnectShare != 0.2 || c.SlowReaderShare != 0.1 || c.SlowReadDelay != 3*time.Millisecond ||
		c.DistinctPrompts != 4 || c.Seed != 9 || c.Tokens != 12 || c.Verify || c.MaxTokens != 5 ||
		c.UserIDs != 6 || c.Timeout != 9*time.Second || c.Headers["Authorization"] != "Bearer k" ||
		!o.json || o.cpuprofile != "cpu.out" || c.Mode != "openai" || c.Model != "m-1" || c.RampUp != 3*time.Second {
		t.Errorf("parsed %+v", o)
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want int
	}{
		{nil, 0},
		{flag.ErrHelp, 0},
		{errUsage, 2},
		{errLost, 1},
		{errors.New("other"), 1},
	}
	for _, tt := range tests {
		if got := exitCode(tt.err); got != tt.want {
			t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}

// newServer answers every request with the simulator's answer under seed 1
// and 48 tokens (the flag defaults), or cuts it after two chunks.
func newServer(tb testing.TB, cut bool) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, err := protocol.DecodeChatRequest(body, protocol.DefaultLimits)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		want := llm.SimChunks(req.Messages, 1, 48)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Stream-Path", "direct")
		var b []byte
		for i, c := range want {
			if cut && i == 2 {
				_, _ = w.Write(b)
				return
			}
			d, _ := json.Marshal(map[string]string{"content": c})
			b = protocol.AppendIDEvent(b, int64(i+1), "", d)
		}
		// The terminal event takes the next id: ids never restart.
		done, _ := json.Marshal(protocol.Done{FinishReason: "stop", Path: "direct"})
		b = protocol.AppendIDEvent(b, int64(len(want)+1), protocol.EventDone, done)
		_, _ = w.Write(b)
	}))
	tb.Cleanup(srv.Close)
	return srv
}

func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cut  bool
		code int
	}{
		{"all done", false, 0},
		{"cut streams are lost", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, tt.cut)
			o, err := parseFlags([]string{"-url", srv.URL + "/v1/stream", "-c", "3", "-n", "9", "-prompts", "4", "-json"}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			o.stdout, o.stderr = &stdout, &stderr
			err = run(t.Context(), o)
			if got := exitCode(err); got != tt.code {
				t.Fatalf("exit code %d (%v), want %d", got, err, tt.code)
			}
			var res struct {
				Done int `json:"done"`
				Lost int `json:"lost"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
			}
			wantDone, wantLost := 9, 0
			if tt.cut {
				wantDone, wantLost = 0, 9
			}
			if res.Done != wantDone || res.Lost != wantLost {
				t.Errorf("done %d lost %d, want %d, %d", res.Done, res.Lost, wantDone, wantLost)
			}
		})
	}
}

// -balance serves a balancer until the context ends, passing requests to
// the backends.
func TestBalanceMode(t *testing.T) {
	t.Parallel()
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "backend "+r.URL.Path)
	}))
	t.Cleanup(backend.Close)
	o, err := parseFlags([]string{"-balance", "127.0.0.1:0", "-backends", backend.URL}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lockedBuffer{}
	o.stdout, o.stderr = io.Discard, stderr
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o) }()
	var addr string
	testutil.Eventually(t, 5*time.Second, func() bool {
		f := strings.Fields(stderr.String())
		if len(f) >= 2 && f[0] == "balancing" {
			addr = f[1]
		}
		return addr != ""
	}, "the balancer listening")
	resp, err := http.Get("http://" + addr + "/x")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "backend /x" {
		t.Fatalf("through the balancer: %q", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("balance ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("balance did not stop")
	}
}

// lockedBuffer is a bytes.Buffer safe for one writer and one reader.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
