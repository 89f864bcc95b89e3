package app

import (
	"fmt"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/llm/breaker"
	"github.com/spillway-dev/spillway/internal/llm/stack"
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/llm/upstream/models"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/streamlog"
)

// The mapping from settings to each component's Config, in one place
// (docs/OPERATIONS.md lists the settings). A field left out here takes the
// component's documented default.

// kafkaSetupTimeout bounds creating the Kafka topics at start.
const kafkaSetupTimeout = 10 * time.Second

// serviceTimeInitial is the first guess of how long a direct stream holds
// its slot, before any finished.
const serviceTimeInitial = time.Second

// SimConfig is the simulator configuration the SIM_* settings give.
func SimConfig(cfg *config.Config) llm.SimConfig {
	return llm.SimConfig{
		FirstToken: cfg.SimFirstToken, TokenInterval: cfg.SimTokenInterval, Tokens: cfg.SimTokens,
		Seed: cfg.SimSeed, FailRate: cfg.SimFailRate, FailMidstreamRate: cfg.SimFailMidstreamRate,
	}
}

// OpenAIConfig is the upstream configuration the LLM_* settings give.
func OpenAIConfig(cfg *config.Config) llm.OpenAIConfig {
	return llm.OpenAIConfig{BaseURL: cfg.LLMBaseURL, APIKey: cfg.LLMAPIKey, Model: cfg.LLMModel, Timeout: cfg.LLMTimeout,
		FirstTokenTimeout: cfg.LLMFirstTokenTimeout, IdleTimeout: cfg.LLMIdleTimeout}
}

// RetryPolicy is the provider retry policy, shared by the workers and the
// direct path's hand-off to the queue: LLM_RETRY_AFTER_MAX_SECONDS caps an
// upstream Retry-After, QUEUE_FAILOVER_BASE_DELAY_MS and _MAX_DELAY_MS
// bound the backoff of other failures (docs/TIMEOUTS.md).
func RetryPolicy(cfg *config.Config) llm.RetryPolicy {
	// The throttled backoff starts at 2 s, or at the cap when it is lower.
	return llm.RetryPolicy{RetryAfterMax: cfg.LLMRetryAfterMax, ThrottleDelay: min(llm.DefaultThrottleDelay, cfg.LLMRetryAfterMax),
		BaseDelay: cfg.QueueFailoverBaseDelay, MaxDelay: cfg.QueueFailoverMaxDelay}
}

// BreakerConfig is the circuit breaker the BREAKER_* settings give.
func BreakerConfig(cfg *config.Config) breaker.Config {
	return breaker.Config{
		ConsecutiveFailures: uint32(cfg.BreakerFailures), Window: cfg.BreakerWindow,
		OpenTimeout: cfg.BreakerOpen, HalfOpenMaxRequests: uint32(cfg.BreakerHalfOpenRequests),
	}
}

// RateLimitConfig is the limiter the RATE_LIMIT_* settings give.
func RateLimitConfig(cfg *config.Config) admission.RateLimitConfig {
	return admission.RateLimitConfig{RPS: cfg.RateLimitRPS, Burst: cfg.RateLimitBurst, KeyPrefix: cfg.QueuePrefix}
}

// OverflowConfig is the overflow gate the QUEUE_OVERFLOW_* settings give.
func OverflowConfig(cfg *config.Config) admission.OverflowConfig {
	return admission.OverflowConfig{
		Threshold: int64(cfg.QueueOverflowThreshold), Hysteresis: int64(cfg.QueueOverflowHysteresis),
		RefreshEvery: cfg.QueueDepthCacheTTL, RetryAfterMax: cfg.QueueRetryAfter,
		ShedLowFraction: cfg.QueueShedLowFraction, ShedNormalFraction: cfg.QueueShedNormalFraction,
	}
}

// DegradeConfig is the degradation level the DEGRADE_* and
// QUEUE_RETRY_AFTER_SECONDS settings give.
func DegradeConfig(cfg *config.Config) admission.DegradeConfig {
	return admission.DegradeConfig{MaxTokens: cfg.DegradeMaxTokens, MinRequests: cfg.DegradeMinRequests,
		ProbeEvery: cfg.DegradeProbeEvery, RetryAfterMax: cfg.QueueRetryAfter}
}

// QuotaConfig is the queue quota the QUEUE_MAX_* settings give.
func QuotaConfig(cfg *config.Config) admission.QuotaConfig {
	return admission.QuotaConfig{Prefix: cfg.QueuePrefix, MaxPerIdentity: cfg.QueueMaxPerIdentity, MaxBytes: cfg.QueueMaxBytes}
}

// RedisPoolConfig is the shared pool the CONNECTION_POOL_* and POOL_*
// settings give; holder names this process. With ADAPTIVE_CONCURRENCY
// the pool obeys the shared limit PoolLimitName.
func RedisPoolConfig(cfg *config.Config, holder string) redispool.Config {
	c := redispool.Config{
		Prefix: cfg.QueuePrefix + "pool:", Size: cfg.ConnectionPoolSize, PerUser: cfg.ConnectionPoolPerUser,
		LeaseTTL: cfg.PoolLeaseTTL, FallbackSize: cfg.PoolLocalFallbackSize, Holder: holder,
		DownAfter: cfg.RedisDownAfter,
		IdleHold:  cfg.PoolIdleHold,
	}
	if cfg.AdaptiveConcurrency {
		c.AdaptiveLimit = stack.PoolLimitName
	}
	return c
}

// AdaptiveConfig is the pool's adaptive limit the ADAPTIVE_* settings
// give, between ADAPTIVE_CONCURRENCY_FLOOR and CONNECTION_POOL_SIZE; nil
// when ADAPTIVE_CONCURRENCY is off. The stack names it, and derives each
// upstream's from it.
func AdaptiveConfig(cfg *config.Config) *adaptive.Config {
	if !cfg.AdaptiveConcurrency {
		return nil
	}
	return &adaptive.Config{
		Params: adaptive.Params{
			Floor: cfg.AdaptiveConcurrencyFloor, Ceiling: cfg.ConnectionPoolSize, Interval: cfg.AdaptiveInterval,
		},
		FirstTokenTarget: cfg.AdaptiveFirstTokenTarget,
	}
}

// StackConfig is the provider stack the LLM_*, SIM_*, BREAKER_*,
// ADAPTIVE_* and upstream settings give; role and holder name this
// process. With the Redis pool, several upstreams' caps, health and
// quotas are shared through Redis too (docs/UPSTREAMS.md).
func StackConfig(cfg *config.Config, role, holder string) (stack.Config, error) {
	sc := stack.Config{
		OpenAI: OpenAIConfig(cfg), Balancer: BalancerConfig(cfg), Health: UpstreamHealthConfig(cfg),
		Breaker: BreakerConfig(cfg), Adaptive: AdaptiveConfig(cfg), Role: role,
	}
	switch cfg.LLMProvider {
	case config.ProviderSim:
		sim := SimConfig(cfg)
		sc.Sim = &sim
	case config.ProviderOpenAI:
		sc.Upstreams = cfg.Upstreams
	default:
		return stack.Config{}, fmt.Errorf("app: unknown LLM_PROVIDER %q", cfg.LLMProvider)
	}
	if cfg.PoolBackend == config.PoolBackendRedis {
		sc.Shared = &upstream.RedisConfig{Prefix: cfg.QueuePrefix + "upstream:", LeaseTTL: cfg.PoolLeaseTTL, Holder: holder}
	}
	return sc, nil
}

// RedisStreamConfig is the Redis Streams queue; member names this process
// in the consumer group.
func RedisStreamConfig(cfg *config.Config, member string) redisstream.Config {
	return redisstream.Config{
		Prefix: cfg.QueuePrefix, Consumer: member, ReclaimIdle: cfg.QueueReclaimIdle, Shards: cfg.QueueShards,
		DeadLetterMaxLen: int64(cfg.DeadLetterMaxLen), DeadLetterTTL: cfg.DeadLetterTTL, KeepPayload: cfg.DeadLetterKeepPayload,
		PriorityAging: cfg.PriorityAging,
	}
}

// jobEnvelopeBytes is what a job adds to its request body: ids, times,
// trace context and priority. A body re-encoded as the job's payload keeps
// its size unless it is full of escapes that decode to longer text.
const jobEnvelopeBytes = 64 << 10

// KafkaConfig is the Kafka queue the KAFKA_* settings give.
func KafkaConfig(cfg *config.Config, claims kafka.Claims) kafka.Config {
	return kafka.Config{
		Brokers: cfg.KafkaBrokers, Partitions: cfg.KafkaPartitions, ReplicationFactor: cfg.KafkaReplicationFactor,
		ClaimTTL: cfg.QueueReclaimIdle, Claims: claims, MaxMessageBytes: KafkaJobBytes(cfg.MaxBodyBytes),
		DeadLetterRetention: cfg.DeadLetterTTL, KeepPayload: cfg.DeadLetterKeepPayload,
	}
}

// KafkaJobBytes is the largest job the Kafka queue is sized for: a body of
// maxBody (MAX_BODY_BYTES) with the job around it, within the job format's
// own bound (docs/QUEUE.md, "Kafka").
func KafkaJobBytes(maxBody int64) int {
	return int(min(int64(protocol.MaxJobBytes), maxBody+jobEnvelopeBytes))
}

// ResultsConfig is the api's half of the result channel.
func ResultsConfig(cfg *config.Config) results.SubscriberConfig {
	return results.SubscriberConfig{Prefix: cfg.QueuePrefix}
}

// GatewayConfig is the api's queued path.
func GatewayConfig(cfg *config.Config) gateway.Config {
	system, name := queueTraceName(cfg)
	return gateway.Config{
		QueueTimeout: cfg.QueueFailoverTimeout, WorkerHeartbeat: cfg.WorkerHeartbeat, ReclaimIdle: cfg.QueueReclaimIdle,
		QueueSystem: system, QueueName: name,
	}
}

// WorkerConfig is the worker configuration the settings give.
func WorkerConfig(cfg *config.Config) worker.Config {
	system, name := queueTraceName(cfg)
	return worker.Config{
		Concurrency: cfg.WorkerConcurrency, Heartbeat: cfg.WorkerHeartbeat,
		BatchSize: cfg.QueueFailoverChunkBatchSize, BatchTimeout: cfg.QueueFailoverChunkBatchTimeout,
		MaxRetries: cfg.QueueFailoverMaxRetries, Retry: RetryPolicy(cfg),
		QueueTimeout: cfg.QueueFailoverTimeout, StopGrace: cfg.ShutdownGrace,
		QueueSystem: system, QueueName: name,
		ReclaimIdle:   cfg.QueueReclaimIdle,
		PriorityAging: cfg.PriorityAging,
	}
}

// queueTraceName is the queue as the enqueue and job spans name it:
// messaging.system and the stream or topic (docs/TRACING.md).
func queueTraceName(cfg *config.Config) (system, name string) {
	if cfg.QueueType == config.QueueTypeKafka {
		return "kafka", kafka.DefaultTopic
	}
	return "redis", redisstream.StreamKey(cfg.QueuePrefix)
}

// StreamConfig is the handler of POST /v1/stream.
func StreamConfig(cfg *config.Config) stream.Config {
	return stream.Config{
		MaxBodyBytes:      cfg.MaxBodyBytes,
		BodyBytesInFlight: cfg.BodyBytesInFlight,
		Limits:            protocol.Limits{MaxMessages: cfg.MaxMessages, MaxTokens: cfg.MaxTokensLimit, MaxChoices: cfg.MaxChoices},
		Heartbeat:         cfg.HeartbeatInterval,
		DirectPathEnabled: cfg.DirectPathEnabled,
		APIKeys:           cfg.APIKeys,
		// Zero trusts the header, matching TRUST_USER_ID_HEADER's default.
		IgnoreUserIDHeader: !cfg.TrustUserIDHeader,
		TrustedProxies:     cfg.TrustedProxies,
		Models:             cfg.LLMModels,
		ServedModels:       ServedModels(cfg),
		BodyReadTimeout:    cfg.BodyReadTimeout,
		ResumeWindow:       cfg.StreamResumeWindow,
		LogTTL:             cfg.StreamLogTTL,
		PriorityMax:        protocol.Priority(cfg.PriorityMax),
		Retry:              RetryPolicy(cfg),
	}
}

// UpstreamHealthConfig is the passive health of several upstreams the
// LLM_UPSTREAM_* settings give.
func UpstreamHealthConfig(cfg *config.Config) upstream.HealthConfig {
	return upstream.HealthConfig{MaxFails: cfg.LLMUpstreamMaxFails, Cooldown: cfg.LLMUpstreamCooldown}
}

// BalancerConfig is the routing over several upstreams the LLM_ROUTING,
// LLM_AFFINITY_BALANCE, LLM_RETRY_AFTER_MAX_SECONDS and
// LLM_UPSTREAM_PROBE_SECONDS settings give.
func BalancerConfig(cfg *config.Config) upstream.Config {
	return upstream.Config{Routing: cfg.LLMRouting, AffinityBalance: cfg.LLMAffinityBalance,
		RetryAfterMax: cfg.LLMRetryAfterMax, ProbeEvery: cfg.LLMUpstreamProbe, NonTextPartTokens: cfg.NonTextPartTokens}
}

// OpenAIModels are the models the configuration names: the simulator's
// name with LLM_PROVIDER=sim; with upstreams, the union of the `models`
// the YAML upstreams list (none when every upstream takes any model it
// knows). GET /v1/models always lists them (docs/API.md, "Models").
func OpenAIModels(cfg *config.Config) []string {
	if cfg.LLMProvider == "sim" {
		return []string{"sim"}
	}
	var models []string
	for _, s := range cfg.Upstreams {
		for _, m := range s.Models {
			if !slices.Contains(models, m) {
				models = append(models, m)
			}
		}
	}
	return models
}

// alwaysListed are the models GET /v1/models lists whatever the upstreams'
// own lists say: LLM_MODEL first (the model an answer names when the
// request names none), then OpenAIModels.
func alwaysListed(cfg *config.Config) []string {
	ids := OpenAIModels(cfg)
	if m := cfg.LLMModel; m != "" {
		ids = append([]string{m}, slices.DeleteFunc(ids, func(id string) bool { return id == m })...)
	}
	return ids
}

// ModelsConfig is the model list of GET /v1/models: the upstreams' own
// lists (none with the simulator), cached MODELS_CACHE_SECONDS, with
// alwaysListed and the LLM_MODELS allow-list.
func ModelsConfig(cfg *config.Config) models.Config {
	var ups []upstream.Spec
	if cfg.LLMProvider == config.ProviderOpenAI {
		ups = cfg.Upstreams
	}
	return models.Config{Upstreams: ups, Always: alwaysListed(cfg), Allow: cfg.LLMModels, TTL: cfg.ModelsCacheTTL}
}

// ServedModels are the models the upstreams serve when every upstream
// lists its own: a request for another is a 400. Nil when some upstream
// takes any model, or with one plain upstream (it judges the model).
func ServedModels(cfg *config.Config) []string {
	if cfg.LLMProvider != config.ProviderOpenAI {
		return nil
	}
	for _, s := range cfg.Upstreams {
		if len(s.Models) == 0 {
			return nil
		}
	}
	return OpenAIModels(cfg)
}

// StreamLogConfig is the stream log's part of cfg.
func StreamLogConfig(cfg *config.Config) streamlog.Config {
	return streamlog.Config{Prefix: cfg.QueuePrefix, TTL: cfg.StreamLogTTL, FlushInterval: cfg.StreamLogFlush}
}

// streamLogLiveness is how long an api's streams stay resumable after it
// died: three SSE heartbeats (docs/API.md, "Resume and stop").
func streamLogLiveness(cfg *config.Config) time.Duration { return 3 * cfg.HeartbeatInterval }
