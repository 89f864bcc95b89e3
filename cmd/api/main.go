// Command api is Spillway's HTTP server: it streams LLM answers over SSE,
// directly when a pool slot is free and through the queue when not. With no
// REDIS_URL it runs in embedded mode, everything in one process.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/config"
)

func main() {
	configPath := flag.String("config", "", "optional YAML config file (env wins over it)")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this address, e.g. 127.0.0.1:6060 (off when empty)")
	flag.Parse()
	cfg, err := config.FromEnv(*configPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "api: configuration:\n%v\n", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.SlogLevel()})).With("process", "api")
	ctx, stop := shutdownContext(log)
	defer stop()
	if err := run(ctx, cfg, *pprofAddr, log); err != nil {
		log.Error("api stopped", "err", err)
		os.Exit(1)
	}
}

// shutdownContext is cancelled by the first SIGTERM or SIGINT, which
// starts the bounded drain; a second one exits at once, for an operator
// who will not wait (docs/OPERATIONS.md, "Shutdown and drain").
// signal.NotifyContext cannot see the second signal, hence the channel.
func shutdownContext(log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
		case <-done:
			return
		}
		log.Info("signal received: draining; a second signal exits at once")
		cancel()
		select {
		case <-sigs:
			log.Warn("second signal: exiting without waiting for the drain")
			os.Exit(exitSecondSignal)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

// exitSecondSignal is the exit status after a second signal cut the drain
// short.
const exitSecondSignal = 3

// run serves profiles on pprofAddr, when set, while the api runs.
func run(ctx context.Context, cfg *config.Config, pprofAddr string, log *slog.Logger) error {
	if pprofAddr != "" {
		_, stop, err := app.ServePprof(pprofAddr, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return app.Run(ctx, cfg, log)
}
