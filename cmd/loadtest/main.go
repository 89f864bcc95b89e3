// Command loadtest floods a Spillway /v1/stream endpoint with concurrent
// streaming requests, checks every SSE stream against the contract, and
// prints what became of each request. With -mode openai it loads an
// OpenAI-compatible upstream (simllm's /v1/chat/completions) instead and
// checks its streams the same way, so that the upstream alone and the api
// in front of it can be compared with one tool. It exits 1 when any stream
// was lost and 2 on a usage error. It is meant for loopback targets;
// -allow-remote lifts that guard.
//
// With -balance ADDR -backends URL,URL,… it generates no load: it serves
// ADDR as a small load balancer in front of several api processes (least
// connections, responses streamed), until SIGINT or SIGTERM; the
// scale-out benchmark puts it where nginx would be.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/internal/loadtest"
)

// options is the parsed command line.
type options struct {
	cfg        loadtest.Config
	balance    string   // listen address of the balancer mode
	backends   []string // the balancer's backends
	json       bool
	cpuprofile string
	stdout     io.Writer
	stderr     io.Writer
}

// errUsage marks a bad command line (exit 2).
var errUsage = errors.New("usage error")

// errLost is returned by run when any stream was lost (exit 1).
var errLost = errors.New("streams were lost")

func main() {
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
		}
		os.Exit(exitCode(err))
	}
	opts.stdout, opts.stderr = os.Stdout, os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, opts)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
	}
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	return 1
}

// parseFlags turns args into options; every error wraps errUsage or is
// flag.ErrHelp.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	c := &o.cfg
	c.Headers = map[string]string{}
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.URL, "url", "http://127.0.0.1:8080/v1/stream", "stream endpoint")
	fs.IntVar(&c.Concurrency, "c", 10, "concurrent clients")
	fs.IntVar(&c.Requests, "n", 100, "requests in total (0: until -d)")
	fs.DurationVar(&c.Duration, "d", 0, "stop starting requests after this long (0: until -n)")
	fs.DurationVar(&c.ThinkTime, "think", 0, "pause of each client between requests")
	fs.Float64Var(&c.DisconnectShare, "disconnect", 0, "share of requests (0-1) that hang up mid-stream on purpose")
	fs.Float64Var(&c.SlowReaderShare, "slow", 0, "share of requests (0-1) read slowly")
	fs.DurationVar(&c.SlowReadDelay, "slow-delay", 10*time.Millisecond, "a slow reader's pause before each read")
	fs.IntVar(&c.DistinctPrompts, "prompts", 1, "distinct prompt texts to cycle through")
	fs.Int64Var(&c.Seed, "seed", 1, "the server's SIM_SEED, for -verify")
	fs.IntVar(&c.Tokens, "tokens", 48, "the server's SIM_TOKENS, for -verify")
	fs.BoolVar(&c.Verify, "verify", true, "compare every answer with the simulator's (needs LLM_PROVIDER=sim)")
	fs.IntVar(&c.MaxTokens, "max-tokens", 0, "max_tokens to send (0: none)")
	fs.IntVar(&c.ImageBytes, "image-bytes", 0, "send an inline image of this many base64 bytes with every prompt (0: none)")
	fs.IntVar(&c.UserIDs, "users", 0, "spread requests over this many X-User-ID values (0: none)")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "longest time for one stream")
	fs.StringVar(&c.Mode, "mode", loadtest.ModeSpillway, "API to load: spillway (/v1/stream) or openai (an OpenAI-compatible /v1/chat/completions, path \"upstream\")")
	fs.StringVar(&c.Model, "model", loadtest.DefaultModel, "model to name in -mode openai")
	fs.DurationVar(&c.RampUp, "ramp", 0, "spread the clients' first requests evenly over this long")
	fs.IntVar(&c.Slowest, "slowest", 0, "list this many completed streams with the longest first chunk in the result (0: none)")
	fs.Func("H", "extra request header `Name: value` (repeatable)", func(v string) error {
		name, value, ok := strings.Cut(v, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return fmt.Errorf("header %q: want Name: value", v)
		}
		c.Headers[strings.TrimSpace(name)] = strings.TrimSpace(value)
		return nil
	})
	fs.BoolVar(&o.json, "json", false, "print the result as JSON")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the load tool to this file")
	allowRemote := fs.Bool("allow-remote", false, "allow a target that is not a loopback address")
	fs.StringVar(&o.balance, "balance", "", "serve this address as a load balancer over -backends instead of generating load")
	fs.Func("backends", "comma list of the balancer's backend `URLs` (http://127.0.0.1:8080,…)", func(v string) error {
		for b := range strings.SplitSeq(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				o.backends = append(o.backends, b)
			}
		}
		return nil
	})

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if err := c.Validate(); err != nil {
		return o, fmt.Errorf("%w: %v", errUsage, err)
	}
	if (o.balance == "") != (len(o.backends) == 0) {
		return o, fmt.Errorf("%w: -balance and -backends go together", errUsage)
	}
	if o.balance != "" {
		if _, err := loadtest.NewBalancer(o.backends); err != nil {
			return o, fmt.Errorf("%w: %v", errUsage, err)
		}
		if !*allowRemote {
			if err := checkLoopback("http://" + o.balance); err != nil {
				return o, fmt.Errorf("%w: -balance: %v", errUsage, err)
			}
			for _, b := range o.backends {
				if err := checkLoopback(b); err != nil {
					return o, fmt.Errorf("%w: -backends: %v", errUsage, err)
				}
			}
		}
		return o, nil
	}
	if !*allowRemote {
		if err := checkLoopback(c.URL); err != nil {
			return o, fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	return o, nil
}

// checkLoopback refuses a URL whose host is not "localhost" or a loopback
// IP: the tool generates real load and should not be pointed at someone
// else's server by accident.
func checkLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url: %w", err)
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("host %q is not a loopback address; pass -allow-remote to load it anyway", host)
}

func run(ctx context.Context, o options) error {
	if o.balance != "" {
		return balance(ctx, o)
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	progress := func(s loadtest.Snapshot) {
		if s.Elapsed < loadtest.ProgressInterval {
			return // a short run needs no progress line
		}
		fmt.Fprintf(o.stderr, "%6.1fs sent=%d inflight=%d done=%d err=%d refused=%d disconnected=%d lost=%d rate=%.1f/s\n",
			s.Elapsed.Seconds(), s.Sent, s.InFlight, s.Done, s.Errors, s.Refused, s.Disconnected, s.Lost, s.Rate)
	}
	res, err := loadtest.Run(ctx, o.cfg, progress)
	if err != nil {
		return err
	}
	if o.json {
		err = res.WriteJSON(o.stdout)
	} else {
		err = res.WriteTable(o.stdout)
	}
	if err != nil {
		return err
	}
	if res.Lost > 0 {
		return fmt.Errorf("%w: %d of %d", errLost, res.Lost, res.Requests)
	}
	return nil
}

// balanceShutdown bounds the balancer's drain after a signal.
const balanceShutdown = 5 * time.Second

// balance serves o.balance as a load balancer over o.backends until ctx
// ends.
func balance(ctx context.Context, o options) error {
	b, err := loadtest.NewBalancer(o.backends)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.balance)
	if err != nil {
		return fmt.Errorf("balance: %w", err)
	}
	srv := &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(o.stderr, "balancing %s over %s\n", ln.Addr(), strings.Join(o.backends, ","))
	select {
	case err := <-served:
		return fmt.Errorf("balance: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), balanceShutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	return nil
}
