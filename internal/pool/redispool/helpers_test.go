package redispool

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testutil"
)

// logBuffer collects log lines from any goroutine.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many lines contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newTestPool returns a Pool on its own client, as a separate process
// would have, closed when the test ends.
func newTestPool(tb testing.TB, addr string, cfg Config, log *slog.Logger, onFallback func(bool)) *Pool {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	if log == nil {
		log = testutil.DiscardLogger()
	}
	p, err := New(cfg, c, log, onFallback)
	if err != nil {
		tb.Fatal(err)
	}
	// Cleanups run last-in first-out: the pool closes before its client.
	tb.Cleanup(func() { _ = c.Close() })
	tb.Cleanup(p.Close)
	return p
}
