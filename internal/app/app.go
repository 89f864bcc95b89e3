// Package app wires Spillway's two processes from their configuration:
// the api (NewAPI, Run) and the consumer (RunConsumer). cmd/api,
// cmd/consumer and the system tests build them through it.
//
// Who owns what (docs/ARCHITECTURE.md, "Wiring"): this package, with
// cmd/, is the only place that creates Redis and Kafka clients; it closes
// them once, after everything built on them has stopped. Components are
// handed clients and never close what they were handed. deps.go builds
// what both processes share once, wiring.go maps the settings onto each
// component's Config, observability.go owns /metrics and /healthz.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/redact"
)

// Options lets tests replace parts the configuration would build.
type Options struct {
	// Provider replaces the one LLM_PROVIDER names.
	Provider llm.Provider
	// DegradeTimes, when its fields are set, replaces the degradation
	// level's times, so that tests need not wait minutes.
	DegradeTimes DegradeTimes
}

// DegradeTimes are the degradation level's times (docs/OPERATIONS.md,
// "Degradation levels"); a zero field keeps its default. Every process
// of a cluster must use the same Window.
type DegradeTimes struct {
	// Window is "the last minute" of ended requests and queue waits
	// (admission.RecentWindow).
	Window time.Duration
	// RaiseAfter is how long the failure rate holds above a threshold
	// before it raises a level (admission.DegradeRaiseAfter, 10 s).
	RaiseAfter time.Duration
	// Hold is how long the inputs stay below a level before it is left
	// (admission.DegradeHold, 30 s).
	Hold time.Duration
}

// Process roles, which name a process in the consumer group, the pool's
// holders and the logs.
const (
	roleAPI      = "api"
	roleConsumer = "consumer"
)

// InstanceName names this process in the consumer group and logs.
func InstanceName(role string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%s-%d-%s", role, host, os.Getpid(), uuid.NewString()[:8])
}

// upstreamURLs are the upstreams' base URLs as a log may show them: with
// no password (docs/OPERATIONS.md, "Isolation").
func upstreamURLs(cfg *config.Config) []string {
	urls := make([]string, len(cfg.Upstreams))
	for i, u := range cfg.Upstreams {
		urls[i] = redact.URL(u.BaseURL)
	}
	return urls
}

// Run builds the api, listens on HTTP_ADDR and serves until ctx ends.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	a, err := NewAPI(cfg, log, Options{})
	if err != nil {
		return err
	}
	defer a.Close()
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("app: listen %s: %w", cfg.HTTPAddr, err)
	}
	log.Info("api listening", "addr", ln.Addr().String(), "pool_size", cfg.ConnectionPoolSize,
		"per_user", cfg.ConnectionPoolPerUser, "provider", cfg.LLMProvider, "upstreams", upstreamURLs(cfg))
	return a.Serve(ctx, ln)
}
