// Package upstream owns Spillway's fleet of upstreams: the list parsed
// from LLM_BASE_URL or the YAML `upstreams:` entries, the routers that pick
// one per call (least-loaded, weighted, affinity, latency), each
// upstream's cluster-wide concurrency cap, rpm/tpm quota and health
// (passive ejection, cooldown, one trial or probe to come back), and the
// Balancer, an llm.Provider that puts them together, routes around an
// upstream whose own circuit breaker is open (Circuit), retries a failure
// before the first chunk on another upstream, and serves the calls that
// wait for a slot in turn, round-robin between identities (line.go).
// docs/UPSTREAMS.md explains the behaviour to operators.
//
// It lives beside internal/llm rather than inside it: llm holds the
// provider contract and the HTTP clients with no state beyond one call,
// while this package keeps state shared through Redis (caps, health,
// quotas) and imports llm, never the reverse. Callers see an
// llm.Provider, plus TryAcquire/Acquire for the pool-like spill and wait.
//
// Every backend comes in two kinds behind a small interface: in-process
// (LocalCaps, LocalHealth, LocalQuota) for embedded mode and the local
// pool, and on Redis (RedisCaps, RedisHealth, RedisQuota) with keys built
// in keys.go, all under the Redis pool's {pool} hash tag.
package upstream
