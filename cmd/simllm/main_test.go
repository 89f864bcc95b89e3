package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    config
		wantErr string // substring naming the culprit
	}{
		{name: "defaults", want: config{addr: ":8081", sim: llm.DefaultSimConfig()}},
		{name: "HTTP_ADDR", env: map[string]string{"HTTP_ADDR": ":9000"}, want: config{addr: ":9000", sim: llm.DefaultSimConfig()}},
		{name: "flag beats HTTP_ADDR", args: []string{"-addr", "127.0.0.1:7"}, env: map[string]string{"HTTP_ADDR": ":9000"},
			want: config{addr: "127.0.0.1:7", sim: llm.DefaultSimConfig()}},
		{name: "all SIM_*", env: map[string]string{
			"SIM_FIRST_TOKEN_MS": "0", "SIM_TOKEN_MS": "5", "SIM_TOKENS": "7", "SIM_SEED": "-9",
			"SIM_FAIL_RATE": "0.25", "SIM_FAIL_MIDSTREAM_RATE": "1",
		}, want: config{addr: ":8081", sim: llm.SimConfig{TokenInterval: 5 * time.Millisecond, Tokens: 7, Seed: -9, FailRate: 0.25, FailMidstreamRate: 1}}},
		{name: "fault SIM_*", env: map[string]string{
			"SIM_FAIL_FIRST": "3", "SIM_FAIL_STATUS": "429", "SIM_RETRY_AFTER_SECONDS": "20",
			"SIM_STALL_AFTER": "5", "SIM_MAX_CONCURRENCY": "8",
		}, want: config{addr: ":8081", sim: func() llm.SimConfig {
			c := llm.DefaultSimConfig()
			c.FailFirst, c.FailStatus, c.FailRetryAfter, c.StallAfter, c.MaxConcurrency = 3, 429, 20*time.Second, 5, 8
			return c
		}()}},
		{name: "fail status not 429 or 5xx", env: map[string]string{"SIM_FAIL_STATUS": "404"}, wantErr: "SIM_FAIL_STATUS"},
		{name: "fail status 430", env: map[string]string{"SIM_FAIL_STATUS": "430"}, wantErr: "SIM_FAIL_STATUS"},
		{name: "negative stall", env: map[string]string{"SIM_STALL_AFTER": "-1"}, wantErr: "SIM_STALL_AFTER"},
		{name: "bad concurrency", env: map[string]string{"SIM_MAX_CONCURRENCY": "many"}, wantErr: "SIM_MAX_CONCURRENCY"},
		{name: "bad retry after", env: map[string]string{"SIM_RETRY_AFTER_SECONDS": "1.5"}, wantErr: "SIM_RETRY_AFTER_SECONDS"},
		{name: "bad ms", env: map[string]string{"SIM_TOKEN_MS": "fast"}, wantErr: "SIM_TOKEN_MS"},
		{name: "negative ms", env: map[string]string{"SIM_FIRST_TOKEN_MS": "-1"}, wantErr: "SIM_FIRST_TOKEN_MS"},
		{name: "zero tokens", env: map[string]string{"SIM_TOKENS": "0"}, wantErr: "SIM_TOKENS"},
		{name: "bad seed", env: map[string]string{"SIM_SEED": "1.5"}, wantErr: "SIM_SEED"},
		{name: "rate above one", env: map[string]string{"SIM_FAIL_RATE": "2"}, wantErr: "SIM_FAIL_RATE"},
		{name: "rate NaN", env: map[string]string{"SIM_FAIL_MIDSTREAM_RATE": "NaN"}, wantErr: "SIM_FAIL_MIDSTREAM_RATE"},
		{name: "unknown flag", args: []string{"-port", "1"}, wantErr: "port"},
		{name: "stray argument", args: []string{"serve"}, wantErr: "serve"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := loadConfig(tc.args, env(tc.env), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.addr != tc.want.addr || got.sim != tc.want.sim {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestRun starts the server on a free port, answers a request, and stops
// when the context ends.
func TestRun(t *testing.T) {
	t.Parallel()
	addrs := make(chan net.Addr, 1)
	cfg := config{addr: "127.0.0.1:0", sim: llm.SimConfig{Tokens: 4, Seed: 1},
		onListen: func(a net.Addr) { addrs <- a }}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	var addr net.Addr
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	}
	resp, err := http.Post("http://"+addr.String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := strings.Join(llm.SimChunks([]protocol.Message{{Role: "user", Content: "hi"}}, 1, 4), "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		t.Errorf("status %d body %s, want the simulated answer %q", resp.StatusCode, body, want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	if _, err := http.Get("http://" + addr.String() + "/healthz"); err == nil {
		t.Error("server still answers after run returned")
	}
}

func TestRunListenError(t *testing.T) {
	t.Parallel()
	err := run(t.Context(), config{addr: "256.0.0.1:1", sim: llm.DefaultSimConfig()}, slog.New(slog.DiscardHandler))
	if err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("run = %v, want a listen error", err)
	}
}
