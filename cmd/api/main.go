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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, *pprofAddr, log); err != nil {
		log.Error("api stopped", "err", err)
		os.Exit(1)
	}
}

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
