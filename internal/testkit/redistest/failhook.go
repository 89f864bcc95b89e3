package redistest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// injected is the error FailHook gives a failed command: an error reply,
// as a refused AUTH (WRONGPASS) or an OOM is.
type injected struct{}

func (injected) Error() string { return "ERR redistest: injected failure" }
func (injected) RedisError()   {}

// ErrInjected is the error of a command FailHook failed.
var ErrInjected error = injected{}

var _ redis.Error = injected{}

// FailHook is a go-redis hook that fails the Nth command a client sends
// after Arm (commands in a pipeline count one each), to find the code
// that reads a failed command's reply as if it had one. With whole set, a
// pipeline holding the Nth command fails as a whole and its commands carry
// no error of their own, as go-redis leaves them when the connection's
// AUTH is refused; else only that command fails, with an error reply.
// Safe for concurrent use.
type FailHook struct {
	mu    sync.Mutex
	armed bool
	at    int
	whole bool
	seen  int
	fired string // the failed command's name, "" while none failed
}

var _ redis.Hook = (*FailHook)(nil)

// Arm counts commands from zero and fails the at-th (1-based).
func (h *FailHook) Arm(at int, whole bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.at, h.whole, h.seen, h.fired = true, at, whole, 0, ""
}

// Disarm stops failing and counting, and returns the failed command's
// name ("" when fewer than at commands were sent).
func (h *FailHook) Disarm() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = false
	return h.fired
}

// take counts n commands and returns the index among them to fail, -1
// for none.
func (h *FailHook) take(n int, name func(i int) string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.armed {
		return -1
	}
	first := h.seen + 1
	h.seen += n
	if h.fired != "" || h.at < first || h.at > h.seen {
		return -1
	}
	i := h.at - first
	h.fired = name(i)
	return i
}

func (h *FailHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// setup reports whether cmd is one go-redis sends to set up a new
// connection (HELLO, AUTH, SELECT, CLIENT SETINFO): not the code's own.
func setup(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "auth", "select", "client":
		return true
	}
	return false
}

func (h *FailHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !setup(cmd) && h.take(1, func(int) string { return cmd.Name() }) >= 0 {
			cmd.SetErr(ErrInjected)
			return ErrInjected
		}
		return next(ctx, cmd)
	}
}

func (h *FailHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && setup(cmds[0]) {
			return next(ctx, cmds) // a new connection's set-up
		}
		i := h.take(len(cmds), func(i int) string { return "pipeline " + cmds[i].Name() })
		if i < 0 {
			return next(ctx, cmds)
		}
		h.mu.Lock()
		whole := h.whole
		h.mu.Unlock()
		if whole {
			return ErrInjected // the commands keep no error, as after a refused AUTH
		}
		err := next(ctx, cmds)
		cmds[i].SetErr(ErrInjected)
		if err == nil {
			err = ErrInjected
		}
		return err
	}
}

// FailPath is one code path FailEachCommand runs.
type FailPath struct {
	Name string
	// Setup prepares the state for one run, with the hook disarmed.
	Setup func(tb testing.TB)
	// Run runs the path once.
	Run func() error
	// Absorbs says the path may handle a failed command itself and
	// return nil (it falls back, or logs and goes on).
	Absorbs bool
}

// FailEachCommand runs each path once per Redis command it sends and per
// failure mode (one command, a whole pipeline), failing that command, and
// fails the test when a run panics, or returns nil while a command failed
// and the path does not absorb failures. It fails the test when a path
// sends no command at all.
func FailEachCommand(t *testing.T, h *FailHook, paths ...FailPath) {
	t.Helper()
	for _, p := range paths {
		for _, whole := range []bool{false, true} {
			for at := 1; ; at++ {
				if p.Setup != nil {
					p.Setup(t)
				}
				h.Arm(at, whole)
				panicked, err := run(p.Run)
				fired := h.Disarm()
				if panicked != nil {
					t.Errorf("%s: panic with command %d (%s) failed (whole pipeline: %v): %v", p.Name, at, fired, whole, panicked)
				}
				if fired == "" {
					if at == 1 {
						t.Errorf("%s: sent no Redis command", p.Name)
					}
					break
				}
				if err == nil && !p.Absorbs && panicked == nil {
					t.Errorf("%s: command %d (%s) failed (whole pipeline: %v), yet it returned no error", p.Name, at, fired, whole)
				}
				if at > 1000 {
					t.Fatalf("%s: more than 1000 commands", p.Name)
				}
			}
		}
	}
}

func run(f func() error) (panicked any, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Sprint(r)
		}
	}()
	return nil, f()
}

// FailClient returns a client of s whose commands the returned hook fails
// (Arm), closed when the test ends. It does not retry, so that each
// command the code sends is sent, and counted, once.
func (s *Server) FailClient(tb testing.TB) (*redis.Client, *FailHook) {
	tb.Helper()
	hook := &FailHook{}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	c.AddHook(hook)
	tb.Cleanup(func() { _ = c.Close() })
	return c, hook
}

// FailEnv is the set-up of a test that fails each Redis command of a
// component's paths in turn (FailEachCommand).
type FailEnv struct {
	// Server is the test's own redis-server; Server.Client gives a client
	// the hook leaves alone, for setting state up.
	Server *Server
	// Prefix is a key prefix of the test's own.
	Prefix string
	// Client is the client of FailClient, whose commands Hook fails.
	Client *redis.Client
	Hook   *FailHook
}

// StartFail starts a redis-server for a FailEachCommand test and returns
// its FailEnv; all of it is closed when the test ends.
func StartFail(tb testing.TB) FailEnv {
	tb.Helper()
	srv := Start(tb)
	c, hook := srv.FailClient(tb)
	return FailEnv{Server: srv, Prefix: Prefix(tb), Client: c, Hook: hook}
}
