// Command simllm serves the deterministic simulated LLM over an
// OpenAI-compatible HTTP API, for demos, load tests and benchmarks.
//
//	simllm [-addr :8081]
//
// It listens on -addr, else HTTP_ADDR, else :8081, and reads SIM_FIRST_TOKEN_MS,
// SIM_TOKEN_MS, SIM_TOKENS, SIM_SEED, SIM_FAIL_RATE and SIM_FAIL_MIDSTREAM_RATE,
// and the faults the timeout and throttling tests use (docs/TIMEOUTS.md):
//
//	SIM_FAIL_FIRST           the first K calls fail before their first chunk (0)
//	SIM_FAIL_STATUS          status of those failures and SIM_FAIL_RATE's: 429 or 5xx (503)
//	SIM_RETRY_AFTER_SECONDS  Retry-After sent with every refusal (0: none)
//	SIM_STALL_AFTER          fall silent after N chunks until the client leaves (0: off)
//	SIM_MAX_CONCURRENCY      answer 429 when C calls are already in flight (0: no limit)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
)

// shutdownGrace is how long open streams may run on after a stop signal;
// a default answer takes about a second.
const shutdownGrace = 10 * time.Second

type config struct {
	addr string
	sim  llm.SimConfig
	// onListen, when set, is told the bound address (tests listen on :0).
	onListen func(net.Addr)
}

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := loadConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		logger.Error("simllm: bad configuration", "err", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, logger); err != nil {
		logger.Error("simllm stopped", "err", err)
		os.Exit(1)
	}
}

// loadConfig reads flags from args and SIM_* and HTTP_ADDR from getenv.
func loadConfig(args []string, getenv func(string) string, usage io.Writer) (config, error) {
	defAddr := getenv("HTTP_ADDR")
	if defAddr == "" {
		defAddr = ":8081"
	}
	fs := flag.NewFlagSet("simllm", flag.ContinueOnError)
	fs.SetOutput(usage)
	addr := fs.String("addr", defAddr, "listen address (default from HTTP_ADDR)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg := config{addr: *addr, sim: llm.DefaultSimConfig()}
	e := envReader{getenv: getenv}
	cfg.sim.FirstToken = e.millis("SIM_FIRST_TOKEN_MS", cfg.sim.FirstToken)
	cfg.sim.TokenInterval = e.millis("SIM_TOKEN_MS", cfg.sim.TokenInterval)
	cfg.sim.Tokens = e.int("SIM_TOKENS", cfg.sim.Tokens, 1, 1<<20)
	cfg.sim.Seed = e.int64("SIM_SEED", cfg.sim.Seed)
	cfg.sim.FailRate = e.rate("SIM_FAIL_RATE", cfg.sim.FailRate)
	cfg.sim.FailMidstreamRate = e.rate("SIM_FAIL_MIDSTREAM_RATE", cfg.sim.FailMidstreamRate)
	cfg.sim.FailFirst = e.int("SIM_FAIL_FIRST", cfg.sim.FailFirst, 0, math.MaxInt32)
	cfg.sim.FailStatus = e.int("SIM_FAIL_STATUS", cfg.sim.FailStatus, 429, 599)
	if st := cfg.sim.FailStatus; st > 429 && st < 500 {
		e.fail("SIM_FAIL_STATUS", strconv.Itoa(st), "429 or 500 to 599")
	}
	cfg.sim.FailRetryAfter = time.Duration(e.int("SIM_RETRY_AFTER_SECONDS", 0, 0, 86400)) * time.Second
	cfg.sim.StallAfter = e.int("SIM_STALL_AFTER", cfg.sim.StallAfter, 0, 1<<20)
	cfg.sim.MaxConcurrency = e.int("SIM_MAX_CONCURRENCY", cfg.sim.MaxConcurrency, 0, 1<<20)
	if e.err != nil {
		return config{}, e.err
	}
	if err := cfg.sim.Validate(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// envReader parses env variables, keeping the first error, which names the
// variable.
type envReader struct {
	getenv func(string) string
	err    error
}

func (e *envReader) lookup(name string) (string, bool) {
	v := e.getenv(name)
	return v, v != "" && e.err == nil
}

func (e *envReader) fail(name, v, want string) {
	e.err = fmt.Errorf("%s=%q: want %s", name, v, want)
}

func (e *envReader) int(name string, def, lo, hi int) int {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		e.fail(name, v, fmt.Sprintf("an integer from %d to %d", lo, hi))
		return def
	}
	return n
}

func (e *envReader) int64(name string, def int64) int64 {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		e.fail(name, v, "a 64-bit integer")
		return def
	}
	return n
}

func (e *envReader) millis(name string, def time.Duration) time.Duration {
	const maxMS = int(time.Hour / time.Millisecond)
	n := e.int(name, int(def/time.Millisecond), 0, maxMS)
	return time.Duration(n) * time.Millisecond
}

func (e *envReader) rate(name string, def float64) float64 {
	v, ok := e.lookup(name)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0 && f <= 1) {
		e.fail(name, v, "a number from 0 to 1")
		return def
	}
	return f
}

// run serves until ctx ends, then stops accepting connections and lets open
// answers finish for up to shutdownGrace before closing them.
func run(ctx context.Context, cfg config, logger *slog.Logger) error {
	sim, err := llm.NewSim(cfg.sim)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           simserver.New(sim, logger),
		ReadHeaderTimeout: 10 * time.Second,
		// No WriteTimeout: it would cut long streams; the handler sets
		// per-write deadlines instead.
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("simllm: listen %s: %w", cfg.addr, err)
	}
	logger.Info("simllm listening", "addr", ln.Addr().String(),
		"first_token", cfg.sim.FirstToken.String(), "token_interval", cfg.sim.TokenInterval.String(),
		"tokens", cfg.sim.Tokens, "seed", cfg.sim.Seed,
		"fail_rate", cfg.sim.FailRate, "fail_midstream_rate", cfg.sim.FailMidstreamRate,
		"fail_first", cfg.sim.FailFirst, "fail_status", cfg.sim.FailStatus,
		"retry_after", cfg.sim.FailRetryAfter.String(), "stall_after", cfg.sim.StallAfter,
		"max_concurrency", cfg.sim.MaxConcurrency)
	if cfg.onListen != nil {
		cfg.onListen(ln.Addr())
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("simllm: serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("simllm shutting down")
	shCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shCtx); err != nil {
		_ = srv.Close()
		<-serveErr
		return fmt.Errorf("simllm: shutdown: %w", err)
	}
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("simllm: serve: %w", err)
	}
	return nil
}
