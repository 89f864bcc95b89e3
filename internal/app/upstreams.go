package app

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool/adaptive"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/upstream"
)

// Several upstreams (docs/UPSTREAMS.md): with LLM_PROVIDER=openai the
// provider is a Balancer whenever there is more than one upstream, or one
// with a cap, a quota or a model list; a single plain upstream keeps the
// bare client, which is what every earlier setup had.

// usesBalancer reports whether cfg's upstreams need the Balancer.
func usesBalancer(cfg *config.Config) bool {
	if cfg.LLMProvider != config.ProviderOpenAI {
		return false
	}
	if len(cfg.Upstreams) > 1 {
		return true
	}
	for _, s := range cfg.Upstreams {
		if s.MaxConcurrency > 0 || s.RPM > 0 || s.TPM > 0 || len(s.Models) > 0 {
			return true
		}
	}
	return false
}

// newBalancer builds the Balancer over cfg's upstreams. Its caps, health
// and quotas are shared through Redis when the pool is (every api and
// consumer process then counts against one cap per upstream), and kept in
// this process otherwise. The workers' view waits for an upstream slot as
// it waits for a pool slot; the api's only tries, and a request that finds
// every upstream full is handed to the queue like one that finds the pool
// full (upstream.ErrNoUpstream is retryable, llm.ErrNoCapacity).
//
// Each upstream's client sits behind its own circuit breaker, named after
// the upstream (spillway_circuit_state{provider}); the Balancer routes
// around an open one, and the returned Circuits refuse at the gate only
// while every one is open.
//
// With ADAPTIVE_CONCURRENCY each upstream has its own adaptive limit
// (named upstream/<name>, in the pool's store: cluster-wide with the Redis
// pool) between ADAPTIVE_CONCURRENCY_FLOOR and its max_concurrency, or
// CONNECTION_POOL_SIZE for one without: a throttling replica is slowed
// down alone, and its cap is the lower of the two.
func (d *deps) newBalancer(role string) (*upstream.Balancer, *admission.Circuits, error) {
	cfg := d.cfg
	specs := cfg.Upstreams
	if cfg.AdaptiveConcurrency {
		specs = slices.Clone(specs)
		for i := range specs {
			if specs[i].MaxConcurrency == 0 {
				specs[i].MaxConcurrency = cfg.ConnectionPoolSize
			}
		}
	}
	var (
		caps   upstream.Caps
		health upstream.Health
		quota  upstream.Quota
	)
	log := d.log.With("component", "upstreams")
	if cfg.PoolBackend == config.PoolBackendRedis {
		prefix := cfg.QueuePrefix + "upstream:"
		rc, err := upstream.NewRedisCaps(d.rdb, specs, upstream.RedisConfig{Prefix: prefix, LeaseTTL: cfg.PoolLeaseTTL, Holder: d.name}, log)
		if err != nil {
			return nil, nil, fmt.Errorf("app: upstream caps: %w", err)
		}
		d.closers = append(d.closers, func() { _ = rc.Close() })
		rh, err := upstream.NewRedisHealth(d.rdb, specs, prefix, UpstreamHealthConfig(cfg), log)
		if err != nil {
			return nil, nil, fmt.Errorf("app: upstream health: %w", err)
		}
		d.closers = append(d.closers, func() { _ = rh.Close() })
		rq, err := upstream.NewRedisQuota(d.rdb, specs, prefix, log)
		if err != nil {
			return nil, nil, fmt.Errorf("app: upstream quotas: %w", err)
		}
		caps, health, quota = rc, rh, rq
	} else {
		caps = upstream.NewLocalCaps(specs)
		health = upstream.NewLocalHealth(len(specs), UpstreamHealthConfig(cfg), nil)
		quota = upstream.NewLocalQuota(specs)
	}
	m, err := upstream.NewPrometheus(d.obs.reg)
	if err != nil {
		return nil, nil, fmt.Errorf("app: upstream metrics: %w", err)
	}
	limits, err := d.upstreamLimits(specs, caps.(limitSetter), m, log)
	if err != nil {
		return nil, nil, err
	}
	breakers := make([]*admission.Breaker, 0, len(specs))
	b, err := upstream.New(specs, BalancerConfig(cfg), upstream.Deps{
		NewProvider: func(s upstream.Spec) (llm.Provider, error) {
			oc := OpenAIConfig(cfg)
			oc.BaseURL, oc.APIKey = s.BaseURL, s.APIKey
			oc.Tracing = d.tel
			c, err := llm.NewOpenAI(oc)
			if err != nil {
				return nil, err
			}
			om, name := d.obs.m, s.Name
			om.UpstreamKnown(name)
			var p llm.Provider = llm.CountResponses(c, func(code string) { om.UpstreamResponded(name, code) })
			if ctl := limits[name]; ctl != nil {
				p = llm.Observe(p, ctl.Observe)
			}
			bc := BreakerConfig(cfg)
			bc.Name = name
			br, err := admission.NewBreaker(bc, p, om, d.log)
			if err != nil {
				return nil, err
			}
			breakers = append(breakers, br)
			return br, nil
		},
		Caps: caps, Health: health, Quota: quota, Metrics: m, Log: log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("app: upstreams: %w", err)
	}
	// The balancer stops before the caps and health it uses (closers run
	// newest first).
	d.closers = append(d.closers, func() { _ = b.Close() })
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	d.log.Info("several upstreams", "role", role, "upstreams", names, "routing", cfg.LLMRouting,
		"shared", cfg.PoolBackend == config.PoolBackendRedis)
	circuits, err := admission.NewCircuits(d.obs.m, breakers...)
	if err != nil {
		return nil, nil, fmt.Errorf("app: upstream circuits: %w", err)
	}
	return b, circuits, nil
}

// limitSetter is the caps' side of adaptive concurrency per upstream
// (upstream.LocalCaps and RedisCaps).
type limitSetter interface {
	upstream.Caps
	SetLimit(i, n int)
}

// upstreamLimits returns, with ADAPTIVE_CONCURRENCY on, one adaptive
// controller per upstream by name, each running for the process's life
// and setting its upstream's cap in caps after every report, with the
// spillway_upstream_effective_limit gauge read back from caps; nil when
// off. Each learns from its upstream's calls only (llm.Observe around the
// upstream's client, inside its circuit breaker: a refusal by an open
// circuit is no call).
func (d *deps) upstreamLimits(specs []upstream.Spec, caps limitSetter, m *upstream.Prometheus, log *slog.Logger) (map[string]*adaptive.Controller, error) {
	cfg := d.cfg
	if !cfg.AdaptiveConcurrency {
		return nil, nil
	}
	store, ok := d.pool.(adaptive.Store)
	if !ok {
		store = adaptive.NewLocalStore()
	}
	ctls := make(map[string]*adaptive.Controller, len(specs))
	for i, s := range specs {
		ac := UpstreamAdaptiveConfig(cfg, s)
		ctl, err := adaptive.New(ac, store, log, func(n int) {
			caps.SetLimit(i, n)
			// The gauge shows the cap in force, as the caps clamp it.
			m.Limit(s.Name, caps.Limit(i))
		})
		if err != nil {
			return nil, fmt.Errorf("app: adaptive limit of upstream %s: %w", s.Name, err)
		}
		m.Limit(s.Name, caps.Limit(i))
		ctls[s.Name] = ctl
		d.runs = append(d.runs, ctl.Run)
	}
	return ctls, nil
}

// waitingProvider is the workers' view of the provider: a call marks its
// context so that a provider with limited capacity (the Balancer) waits
// for an upstream slot, within the job's deadline, as a worker waits for
// a pool slot, instead of failing with llm.ErrNoCapacity.
type waitingProvider struct{ llm.Provider }

// Stream calls the provider with a context that asks it to wait.
func (w waitingProvider) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	return w.Provider.Stream(llm.WithCapacityWait(ctx), req, emit)
}
