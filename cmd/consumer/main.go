// Command consumer is a standalone Spillway worker: it takes queued
// requests, answers them from the provider and publishes the results to
// the api that holds the client. Scale it apart from the api.
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
		_, stop, err := app.ServePprof(pprofAddr, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	return app.RunConsumer(ctx, cfg, log)
}
