// Package redistest starts real redis-server processes for integration
// tests, on free loopback ports, with no persistence unless asked
// (StartWith), ended by PID when the test finishes: one server (Start), a
// 3-primary Redis Cluster (StartCluster) or a Sentinel-managed primary
// with one replica (StartSentinel).
package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a running redis-server owned by one test.
type Server struct {
	Addr string // 127.0.0.1:port
	Port int
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited and been waited for
	args []string
	dir  string
}

// URL returns a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr }

// Client returns a go-redis client for the server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Start runs redis-server on a free port and waits until it answers PING.
// With -short the calling test is skipped: integration tests need the real
// server, which `make test` installs.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if testing.Short() {
		tb.Skip("redistest: integration test skipped with -short")
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: redis-server not found (make test installs it): %v", err)
	}
	return startServer(tb, bin, serverArgs)
}

// StartWith is Start with extra redis-server arguments after the defaults,
// which they override: StartWith(tb, "--appendonly", "yes") runs a server
// that keeps its data in an append-only file across Restart.
func StartWith(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	if testing.Short() {
		tb.Skip("redistest: integration test skipped with -short")
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: redis-server not found (make test installs it): %v", err)
	}
	return startServer(tb, bin, func(dir string, port int) []string {
		return append(serverArgs(dir, port), extra...)
	})
}

// serverArgs are the settings of every test redis-server.
func serverArgs(dir string, port int) []string {
	return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--maxclients", "20000",
		"--enable-debug-command", "local"} // DEBUG SLEEP plays a busy Redis
}

// startServer runs bin with args(dir, port) on a free port and waits until
// it answers PING, retrying on another port when the chosen one was taken
// meanwhile. The process is killed when the test ends.
func startServer(tb testing.TB, bin string, args func(dir string, port int) []string) *Server {
	tb.Helper()
	s := &Server{dir: tb.TempDir()}
	var err error
	for try := 0; try < 5; try++ {
		s.Port = freePort(tb)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		s.args = args(s.dir, s.Port)
		if err = s.launch(bin); err == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("redistest: start %s: %v", bin, err)
	return nil
}

func (s *Server) launch(bin string) error {
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	s.done = done
	go func() { _ = s.cmd.Wait(); close(done) }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited: %w", s.Addr, err)
		case <-deadline.C:
			_ = s.cmd.Process.Kill()
			return fmt.Errorf("redis-server on %s not ready: %w", s.Addr, err)
		case <-tick.C:
		}
	}
}

// Stop ends the server (SIGKILL); safe to call twice.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Restart starts the server again on the same port after Stop.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.launch(bin); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

// Prefix returns a key prefix unique to the test, so tests may share a
// server without FLUSHDB.
func Prefix(tb testing.TB) string {
	tb.Helper()
	name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name())
	return fmt.Sprintf("t:%s:%d:", name, time.Now().UnixNano())
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
