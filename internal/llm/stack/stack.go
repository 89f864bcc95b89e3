// Package stack assembles the provider stack every call goes through,
// direct or from a queue worker (docs/ARCHITECTURE.md, "The provider
// wing"): the client (the simulator, one OpenAI-compatible upstream, or
// the Balancer over several), each upstream's response count, its
// adaptive limit and its circuit breaker, in that order from the inside.
// Both processes build it with New; nothing else stacks these layers.
package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/llm/breaker"
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// PoolLimitName names the pool's adaptive limit: one for the whole
// provider, which the Redis pool obeys (redispool.Config.AdaptiveLimit).
const PoolLimitName = "global"

// upstreamLimitPrefix begins the name of an upstream's adaptive limit;
// the upstream's name follows.
const upstreamLimitPrefix = "upstream/"

// Config is the provider stack the settings give (internal/app maps
// them). The provider is the simulator when Sim is set, else
// OpenAI-compatible over Upstreams.
type Config struct {
	// Sim, when set, makes the simulator the provider (LLM_PROVIDER=sim).
	Sim *llm.SimConfig
	// OpenAI is the client of one upstream (the LLM_* settings, with its
	// Tracing); with several, each takes its upstream's base URL and key.
	OpenAI llm.OpenAIConfig
	// Upstreams are the configured upstreams. One plain upstream keeps
	// the bare client; more than one, or one with a cap, a quota or a
	// model list, are routed by the Balancer (docs/UPSTREAMS.md).
	Upstreams []upstream.Spec
	// Balancer is the routing over several upstreams.
	Balancer upstream.Config
	// Health is the passive health of several upstreams.
	Health upstream.HealthConfig
	// Shared, when set, keeps several upstreams' caps, health and quotas
	// in Redis, shared by every api and consumer process (with the Redis
	// pool); nil keeps them in this process.
	Shared *upstream.RedisConfig
	// Breaker is each circuit's configuration; its Name is set here.
	Breaker breaker.Config
	// Adaptive, when set, turns on adaptive concurrency
	// (ADAPTIVE_CONCURRENCY): its Params are the pool's limit, between
	// the floor and the pool's size, or with several upstreams each
	// upstream's, up to its max_concurrency (or the pool's size without
	// one). Its Name is set here.
	Adaptive *adaptive.Config
	// Role names the process in the log line that lists the upstreams.
	Role string
}

// Deps are what the stack is built on. Metrics, Registry and Log are
// required; Redis when Config.Shared is set.
type Deps struct {
	// Provider, when set, replaces the client the Config names (tests);
	// it still sits behind the response count, the limit and the breaker.
	Provider llm.Provider
	// Redis is the client shared caps, health and quotas use.
	Redis redis.UniversalClient
	// Limits is the store the adaptive limits are kept in: the Redis
	// pool's, shared by every process; nil keeps them in this process.
	Limits adaptive.Store
	// SetPoolLimit applies the pool's adaptive limit to a pool that keeps
	// it in process (pool.Local.SetLimit); nil when Limits is the pool.
	SetPoolLimit func(int)
	// Metrics holds spillway_circuit_state and the upstream response
	// counts; Registry takes the several-upstreams metrics.
	Metrics  *metrics.Metrics
	Registry prometheus.Registerer
	Log      *slog.Logger
}

// Stack is the assembled provider. It is built once per process by New,
// runs its adaptive limits in Run, and is released by Close.
type Stack struct {
	provider llm.Provider
	circuit  interface{ OpenFor() time.Duration }
	limits   []*adaptive.Controller
	closers  []func()
}

// New builds the stack. A single provider (injected, the simulator, or
// one plain upstream) sits behind one breaker, its calls counted in
// spillway_upstream_responses_total and observed by the pool's adaptive
// limit beneath the breaker. Several upstreams each sit behind their own
// breaker and limit, inside the Balancer (docs/UPSTREAMS.md, "Health"):
// one failing replica opens only its circuit and is routed around, and
// OpenFor is non-zero only while every circuit is open. On error New
// releases what it built.
func New(cfg Config, deps Deps) (s *Stack, err error) {
	if deps.Metrics == nil || deps.Registry == nil || deps.Log == nil {
		return nil, errors.New("stack: needs metrics, a registry and a logger")
	}
	if cfg.Shared != nil && deps.Redis == nil {
		return nil, errors.New("stack: shared upstream state needs a Redis client")
	}
	s = &Stack{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if deps.Provider == nil && cfg.Sim == nil && needsBalancer(cfg.Upstreams) {
		return s, s.balanced(cfg, deps)
	}
	return s, s.single(cfg, deps)
}

// needsBalancer reports whether upstreams need the Balancer: more than one, or
// one with a cap, a quota or a model list. A single plain upstream keeps
// the bare client, which is what every earlier setup had.
func needsBalancer(upstreams []upstream.Spec) bool {
	if len(upstreams) > 1 {
		return true
	}
	for _, s := range upstreams {
		if s.MaxConcurrency > 0 || s.RPM > 0 || s.TPM > 0 || len(s.Models) > 0 {
			return true
		}
	}
	return false
}

// single builds one provider behind one breaker. The breaker is named
// after the provider; its responses are counted under the upstream's
// name when there is one upstream, else under the provider's.
func (s *Stack) single(cfg Config, deps Deps) error {
	p, label := deps.Provider, ""
	if p == nil {
		var err error
		if cfg.Sim != nil {
			p, err = llm.NewSim(*cfg.Sim)
		} else {
			p, err = llm.NewOpenAI(cfg.OpenAI)
			if len(cfg.Upstreams) == 1 {
				label = cfg.Upstreams[0].Name
			}
		}
		if err != nil {
			return err
		}
	}
	if label == "" {
		label = p.Name()
	}
	var pool *adaptive.Controller
	if cfg.Adaptive != nil {
		ac := *cfg.Adaptive
		ac.Name = PoolLimitName
		store := deps.Limits
		if store == nil {
			store = adaptive.NewLocalStore()
		}
		ctl, err := adaptive.New(ac, store, deps.Log.With("component", "pool"), deps.SetPoolLimit)
		if err != nil {
			return err
		}
		pool = ctl
		s.limits = append(s.limits, ctl)
	}
	m := deps.Metrics
	m.UpstreamKnown(label)
	counted := llm.CountResponses(p, func(code string) { m.UpstreamResponded(label, code) })
	observed := llm.Observe(counted, func(c llm.Call) {
		if pool != nil {
			pool.Observe(c)
		}
	})
	br, err := breaker.New(cfg.Breaker, observed, m, deps.Log)
	if err != nil {
		return err
	}
	s.provider, s.circuit = br, br
	return nil
}

// balanced builds the Balancer over cfg.Upstreams. Its caps, health and
// quotas are shared through Redis when cfg.Shared says so (every api and
// consumer process then counts against one cap per upstream), and kept in
// this process otherwise. The workers' view (ForWorkers) waits for an
// upstream slot as it waits for a pool slot; the api's only tries, and a
// request that finds every upstream full is handed to the queue like one
// that finds the pool full (upstream.ErrNoUpstream is retryable,
// llm.ErrNoCapacity).
//
// Each upstream's client sits behind its own circuit breaker, named after
// the upstream (spillway_circuit_state{provider}); the Balancer routes
// around an open one, and the gate refuses only while every one is open.
//
// With adaptive concurrency each upstream has its own limit (named
// upstreamLimitPrefix and the upstream's name, in deps.Limits: cluster-wide
// with the Redis pool) between the floor and its max_concurrency, or the
// pool's size for one without: a throttling replica is slowed down alone,
// and its cap is the lower of the two.
func (s *Stack) balanced(cfg Config, deps Deps) error {
	specs := cfg.Upstreams
	if cfg.Adaptive != nil {
		specs = slices.Clone(specs)
		for i := range specs {
			if specs[i].MaxConcurrency == 0 {
				specs[i].MaxConcurrency = cfg.Adaptive.Params.Ceiling
			}
		}
	}
	var (
		caps   limitedCaps
		health upstream.Health
		quota  upstream.Quota
	)
	log := deps.Log.With("component", "upstreams")
	if sh := cfg.Shared; sh != nil {
		rc, err := upstream.NewRedisCaps(deps.Redis, specs, *sh, log)
		if err != nil {
			return fmt.Errorf("stack: upstream caps: %w", err)
		}
		s.closers = append(s.closers, func() { _ = rc.Close() })
		rh, err := upstream.NewRedisHealth(deps.Redis, specs, sh.Prefix, cfg.Health, log)
		if err != nil {
			return fmt.Errorf("stack: upstream health: %w", err)
		}
		s.closers = append(s.closers, func() { _ = rh.Close() })
		rq, err := upstream.NewRedisQuota(deps.Redis, specs, sh.Prefix, log)
		if err != nil {
			return fmt.Errorf("stack: upstream quotas: %w", err)
		}
		caps, health, quota = rc, rh, rq
	} else {
		caps = upstream.NewLocalCaps(specs)
		health = upstream.NewLocalHealth(len(specs), cfg.Health, nil)
		quota = upstream.NewLocalQuota(specs)
	}
	um, err := upstream.NewPrometheus(deps.Registry)
	if err != nil {
		return fmt.Errorf("stack: upstream metrics: %w", err)
	}
	limits, err := s.upstreamLimits(cfg, deps, specs, caps, um, log)
	if err != nil {
		return err
	}
	m := deps.Metrics
	breakers := make([]*breaker.Breaker, 0, len(specs))
	b, err := upstream.New(specs, cfg.Balancer, upstream.Deps{
		NewProvider: func(sp upstream.Spec) (llm.Provider, error) {
			oc := cfg.OpenAI
			oc.BaseURL, oc.APIKey = sp.BaseURL, sp.APIKey
			c, err := llm.NewOpenAI(oc)
			if err != nil {
				return nil, err
			}
			name := sp.Name
			m.UpstreamKnown(name)
			p := llm.CountResponses(c, func(code string) { m.UpstreamResponded(name, code) })
			if ctl := limits[name]; ctl != nil {
				p = llm.Observe(p, ctl.Observe)
			}
			bc := cfg.Breaker
			bc.Name = name
			br, err := breaker.New(bc, p, m, deps.Log)
			if err != nil {
				return nil, err
			}
			breakers = append(breakers, br)
			return br, nil
		},
		Caps: caps, Health: health, Quota: quota, Metrics: um, Log: log,
	})
	if err != nil {
		return fmt.Errorf("stack: upstreams: %w", err)
	}
	// The balancer stops before the caps and health it uses (Close runs
	// newest first).
	s.closers = append(s.closers, func() { _ = b.Close() })
	names := make([]string, len(specs))
	for i, sp := range specs {
		names[i] = sp.Name
	}
	deps.Log.Info("several upstreams", "role", cfg.Role, "upstreams", names, "routing", cfg.Balancer.Routing,
		"shared", cfg.Shared != nil)
	circuits, err := breaker.NewCircuits(breakers...)
	if err != nil {
		return fmt.Errorf("stack: upstream circuits: %w", err)
	}
	// Each upstream's limit learns from its own calls, beneath its
	// breaker; nothing observes the Balancer's answer as a whole.
	s.provider, s.circuit = b, circuits
	return nil
}

// limitedCaps are the caps' side of adaptive concurrency per upstream
// (upstream.LocalCaps and RedisCaps).
type limitedCaps interface {
	upstream.Caps
	SetLimit(i, n int)
}

// upstreamLimits returns, with adaptive concurrency on, one controller per
// upstream by name, each setting its upstream's cap in caps after every
// report, with the spillway_upstream_effective_limit gauge read back from
// caps; nil when off. Each learns from its upstream's calls only
// (llm.Observe around the upstream's client, inside its circuit breaker:
// a refusal by an open circuit is no call).
func (s *Stack) upstreamLimits(cfg Config, deps Deps, specs []upstream.Spec, caps limitedCaps, m *upstream.Prometheus,
	log *slog.Logger) (map[string]*adaptive.Controller, error) {
	if cfg.Adaptive == nil {
		return nil, nil
	}
	store := deps.Limits
	if store == nil {
		store = adaptive.NewLocalStore()
	}
	ctls := make(map[string]*adaptive.Controller, len(specs))
	for i, sp := range specs {
		ac := *cfg.Adaptive
		ac.Name = upstreamLimitPrefix + sp.Name
		ac.Params.Ceiling = sp.MaxConcurrency
		ac.Params.Floor = min(ac.Params.Floor, sp.MaxConcurrency)
		ctl, err := adaptive.New(ac, store, log, func(n int) {
			caps.SetLimit(i, n)
			// The gauge shows the cap in force, as the caps clamp it.
			m.Limit(sp.Name, caps.Limit(i))
		})
		if err != nil {
			return nil, fmt.Errorf("stack: adaptive limit of upstream %s: %w", sp.Name, err)
		}
		m.Limit(sp.Name, caps.Limit(i))
		ctls[sp.Name] = ctl
		s.limits = append(s.limits, ctl)
	}
	return ctls, nil
}

// Provider is the provider as the api's direct path calls it: behind its
// circuit(s); a Balancer without capacity fails with llm.ErrNoCapacity
// at once, so the request goes to the queue.
func (s *Stack) Provider() llm.Provider { return s.provider }

// ForWorkers is the provider as queue workers call it: behind the same
// circuits, but a call marks its context (llm.WithCapacityWait) so that a
// provider with limited capacity (the Balancer) waits for an upstream
// slot, within the job's deadline, as a worker waits for a pool slot.
func (s *Stack) ForWorkers() llm.Provider { return waiting{s.provider} }

// OpenFor is how long the provider refuses every call: its breaker's open
// time, or with several upstreams the shortest while every circuit is
// open; 0 while it takes calls. It reads memory only (admission.Circuit).
func (s *Stack) OpenFor() time.Duration { return s.circuit.OpenFor() }

// Run runs the adaptive limits' reports until ctx ends, and returns once
// each has stopped; at once when adaptive concurrency is off.
func (s *Stack) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ctl := range s.limits {
		wg.Go(func() { ctl.Run(ctx) })
	}
	wg.Wait()
}

// Close releases what New built, newest first: the Balancer, then the
// shared health and caps. The Redis client is the caller's.
func (s *Stack) Close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// waiting is the workers' view of the provider.
type waiting struct{ llm.Provider }

// Stream calls the provider with a context that asks it to wait.
func (w waiting) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	return w.Provider.Stream(llm.WithCapacityWait(ctx), req, emit)
}
