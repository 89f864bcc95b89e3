// Command spillway-admin is the operator's tool for the queue's dead
// letters: list, show, replay (under a new request id, printing the
// answer) and purge. It reads the settings of the other Spillway processes
// (docs/OPERATIONS.md, "Dead letters: spillway-admin").
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spillway-dev/spillway/internal/admin"
	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Environ(), app.AdminIO{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	os.Exit(code)
}

// run parses the global flags and the configuration (environ, and the
// -config file), then runs the command; it returns the exit status.
func run(ctx context.Context, args, environ []string, stdio app.AdminIO) int {
	fs := flag.NewFlagSet("spillway-admin", flag.ContinueOnError)
	fs.SetOutput(stdio.Stderr)
	configPath := fs.String("config", "", "optional YAML config file (env wins over it)")
	fs.Usage = func() { fmt.Fprint(stdio.Stderr, admin.Usage) }
	if err := fs.Parse(args); err != nil {
		return admin.ExitUsage
	}
	if code, done := admin.Preflight(fs.Args(), stdio.Stdout, stdio.Stderr); done {
		return code
	}
	cfg, err := config.Load(*configPath, envMap(environ))
	if err != nil {
		fmt.Fprintf(stdio.Stderr, "spillway-admin: configuration:\n%v\n", err)
		return admin.ExitUsage
	}
	return app.RunAdmin(ctx, cfg, logger(cfg, stdio.Stderr), fs.Args(), stdio)
}

// logger writes warnings and errors as text on stderr, beside the
// command's own messages; LOG_LEVEL=debug shows more.
func logger(cfg *config.Config, w io.Writer) *slog.Logger {
	level := max(cfg.SlogLevel(), slog.LevelWarn)
	if cfg.SlogLevel() < slog.LevelInfo {
		level = cfg.SlogLevel()
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("process", "spillway-admin")
}

func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}
