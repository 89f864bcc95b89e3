package app

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// lockedBuffer is a bytes.Buffer safe for a logger and a reader at once.
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

// The api's startup lines name its upstream and its Redis without the
// password their URLs carry (issue 29).
func TestStartupLogHidesURLPasswords(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-pw"
	_, upstream := startSimllm(t, fastSim())
	srv := redistest.Start(t)
	cfg := testConfig(t, map[string]string{
		"HTTP_ADDR": "127.0.0.1:0", "REDIS_URL": srv.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": strings.Replace(upstream, "http://", "http://user:"+secret+"@", 1),
		"SHUTDOWN_GRACE_SECONDS": "1",
	})
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, slog.New(slog.NewJSONHandler(&logs, nil))) }()
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), `"msg":"api listening"`) }, "the api listening")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	out := logs.String()
	if strings.Contains(out, secret) {
		t.Fatalf("the logs show the password:\n%s", out)
	}
	if !strings.Contains(out, `"upstreams":["http://user:xxxxx@`) || !strings.Contains(out, `"url":"redis://`) {
		t.Fatalf("the startup lines do not name the upstream and Redis:\n%s", out)
	}
}
