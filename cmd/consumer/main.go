// Command consumer is a standalone Spillway worker: it takes queued
// requests, answers them from the provider and publishes the results to
// the api that holds the client. Scale it apart from the api.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/config"
)

func main() {
	configPath := flag.String("config", "", "optional YAML config file (env wins over it)")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this address, e.g. 127.0.0.1:6060 (off when empty)")
	flag.Parse()
	cfg, err := config.FromEnv(*configPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "consumer: configuration:\n%v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.SlogLevel()})).With("process", "consumer")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, *pprofAddr, log); err != nil {
		log.Error("consumer stopped", "err", err)
		os.Exit(1)
	}
}

// run serves profiles on pprofAddr, when set, while the consumer runs.
func run(ctx context.Context, cfg *config.Config, pprofAddr string, log *slog.Logger) error {
	if pprofAddr != "" {
		stop, err := servePprof(pprofAddr, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return app.RunConsumer(ctx, cfg, log)
}

// servePprof serves net/http/pprof on its own listener and mux, apart from
// the consumer's routes, so profiles are reachable only where the operator
// chose (a loopback address, normally). stop shuts it down and waits.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof: listen %s: %w", addr, err)
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		log.Warn("pprof listens on a non-loopback address: profiles reveal internals", "addr", ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // named profiles: heap, goroutine, allocs, …
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// No WriteTimeout: a CPU profile or trace streams for as long as asked.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server stopped", "err", err)
		}
	})
	log.Info("pprof listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close() // a profile still being written is cut
		}
		wg.Wait()
	}, nil
}
