// Package config owns Spillway's one typed configuration: its defaults, how
// it is read from the environment and an optional YAML file (env wins), and
// its validation at start.
package config

import (
	"github.com/spillway-dev/spillway/internal/llm/upstream"

	"log/slog"
	"strings"
	"time"
)

// Config is every setting of the api, consumer and simllm processes. Env
// names and defaults are the contract in docs/OPERATIONS.md, "Settings"; the yaml key of each
// field is its env name in lower case. Defaults gives each default, taken
// from the component that uses it. A time.Duration field is read in the
// unit its env name ends in: _MS, _SECONDS or _HOURS, a whole number. A
// field tagged `bounds:"<package>.<Type>.<Field>"` has its range checked
// by that component's Validate (validate.go); Validate here holds the
// rest and the rules between settings.
type Config struct {
	// HTTPAddr is the api listen address.
	HTTPAddr string `env:"HTTP_ADDR"`
	// ConsumerHTTPAddr serves the consumer's /metrics and /healthz.
	ConsumerHTTPAddr string `env:"CONSUMER_HTTP_ADDR"`
	// RedisURL is a redis:// or rediss:// URL of one Redis. Embedded mode
	// when it, RedisClusterAddrs and RedisSentinelAddrs are all empty.
	RedisURL string `env:"REDIS_URL"`
	// RedisClusterAddrs are host:port seed nodes of a Redis Cluster
	// (instead of RedisURL).
	RedisClusterAddrs []string `env:"REDIS_CLUSTER_ADDRS" envSeparator:","`
	// RedisSentinelAddrs are host:port Sentinels that name the primary
	// (instead of RedisURL); RedisSentinelMaster is required with them.
	RedisSentinelAddrs []string `env:"REDIS_SENTINEL_ADDRS" envSeparator:","`
	// RedisSentinelMaster is the master name the Sentinels monitor.
	RedisSentinelMaster string `env:"REDIS_SENTINEL_MASTER"`
	// RedisSentinelPassword authenticates to the Sentinels themselves.
	RedisSentinelPassword string `env:"REDIS_SENTINEL_PASSWORD"`
	// RedisPassword authenticates to the data nodes in Cluster and
	// Sentinel mode (a REDIS_URL carries its own).
	RedisPassword string `env:"REDIS_PASSWORD"`
	// RedisPoolSize is the go-redis connections per Redis node; 0 means
	// max(64, 2×WorkerConcurrency+8).
	RedisPoolSize int `env:"REDIS_POOL_SIZE" bounds:"redisclient.Options.PoolSize"`
	// RedisMinIdleConns are kept open per node so a burst does not dial.
	// 0 opens them on demand.
	RedisMinIdleConns int `env:"REDIS_MIN_IDLE_CONNS" bounds:"redisclient.Options.MinIdleConns"`
	// RedisDialTimeout bounds opening a connection.
	RedisDialTimeout time.Duration `env:"REDIS_DIAL_TIMEOUT_MS" bounds:"redisclient.Options.DialTimeout"`
	// RedisTimeout bounds one read or write on a connection.
	RedisTimeout time.Duration `env:"REDIS_TIMEOUT_MS" bounds:"redisclient.Options.Timeout"`
	// RedisPoolTimeout bounds the wait for a free connection when all
	// are busy.
	RedisPoolTimeout time.Duration `env:"REDIS_POOL_TIMEOUT_MS" bounds:"redisclient.Options.PoolTimeout"`
	// RedisDownAfter is how long Redis may leave the health probe
	// unanswered, after a call timed out, before it counts as down (the
	// pool's fallback).
	RedisDownAfter time.Duration `env:"REDIS_DOWN_AFTER_MS" bounds:"redispool.Config.DownAfter"`
	// QueueShards splits the Redis Streams queue over this many streams,
	// 1 to 64.
	QueueShards int `env:"QUEUE_SHARDS" bounds:"redisstream.Config.Shards"`

	// QueueType is "redis" or "kafka".
	QueueType string `env:"QUEUE_TYPE"`
	// KafkaBrokers lists host:port brokers, needed when QueueType is kafka.
	KafkaBrokers []string `env:"KAFKA_BROKERS" envSeparator:","`
	// KafkaPartitions is the partition count used when the topic is created.
	KafkaPartitions int `env:"KAFKA_PARTITIONS" bounds:"kafka.Config.Partitions"`
	// KafkaReplicationFactor is used when the topic is created.
	KafkaReplicationFactor int `env:"KAFKA_REPLICATION_FACTOR" bounds:"kafka.Config.ReplicationFactor"`

	// QueueFailoverEnabled off makes a full pool answer 503.
	QueueFailoverEnabled bool `env:"QUEUE_FAILOVER_ENABLED"`
	// DirectPathEnabled off sends every request through the queue.
	DirectPathEnabled bool `env:"DIRECT_PATH_ENABLED"`
	// QueueFailoverTimeout is the longest wait for a worker to start a job.
	QueueFailoverTimeout time.Duration `env:"QUEUE_FAILOVER_TIMEOUT_SECONDS" bounds:"worker.Config.QueueTimeout"`
	// QueueFailoverMaxRetries is provider retries before dead-letter.
	QueueFailoverMaxRetries int `env:"QUEUE_FAILOVER_MAX_RETRIES" bounds:"worker.Config.MaxRetries"`
	// QueueFailoverBaseDelay is the first backoff delay.
	QueueFailoverBaseDelay time.Duration `env:"QUEUE_FAILOVER_BASE_DELAY_MS"`
	// QueueFailoverMaxDelay caps the backoff delay.
	QueueFailoverMaxDelay time.Duration `env:"QUEUE_FAILOVER_MAX_DELAY_MS"`
	// QueueFailoverChunkBatchSize is the chunks that make a published batch full.
	QueueFailoverChunkBatchSize int `env:"QUEUE_FAILOVER_CHUNK_BATCH_SIZE" bounds:"worker.Config.BatchSize"`
	// QueueFailoverChunkBatchTimeout flushes a partial batch after this long.
	QueueFailoverChunkBatchTimeout time.Duration `env:"QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS" bounds:"worker.Config.BatchTimeout"`
	// QueueReclaimIdle is how long a job may sit idle before another worker takes it over.
	QueueReclaimIdle time.Duration `env:"QUEUE_RECLAIM_IDLE_SECONDS"`
	// DeadLetterMaxLen bounds each dead-letter stream (XADD MAXLEN ~); Kafka has no count bound.
	DeadLetterMaxLen int `env:"DEAD_LETTER_MAX_LEN" bounds:"redisstream.Config.DeadLetterMaxLen"`
	// DeadLetterTTL is how long the dead-letter stream lives after its last record, and the
	// Kafka dead-letter topic's retention.
	DeadLetterTTL time.Duration `env:"DEAD_LETTER_TTL_HOURS" bounds:"redisstream.Config.DeadLetterTTL"`
	// DeadLetterKeepPayload stores the job's prompt in a dead letter (both queues); false keeps a
	// digest and sizes only.
	DeadLetterKeepPayload bool `env:"DEAD_LETTER_KEEP_PAYLOAD"`
	// QueueOverflowThreshold is the backlog at which queued requests get 503.
	QueueOverflowThreshold int `env:"QUEUE_OVERFLOW_THRESHOLD" bounds:"admission.OverflowConfig.Threshold"`
	// QueueOverflowHysteresis is how far below the threshold the backlog must fall before accepting again.
	QueueOverflowHysteresis int `env:"QUEUE_OVERFLOW_HYSTERESIS" bounds:"admission.OverflowConfig.Hysteresis"`
	// QueueShedLowFraction is the share of the threshold from which low-priority requests get 503.
	QueueShedLowFraction float64 `env:"QUEUE_SHED_LOW_FRACTION" bounds:"admission.OverflowConfig.ShedLowFraction"`
	// QueueShedNormalFraction is the share of the threshold from which normal requests get 503.
	QueueShedNormalFraction float64 `env:"QUEUE_SHED_NORMAL_FRACTION"`
	// PriorityAging is how long a queued job waits to count one priority level higher.
	PriorityAging time.Duration `env:"PRIORITY_AGING_SECONDS" bounds:"redisstream.Config.PriorityAging"`
	// DegradeMaxTokens caps a normal request's max_tokens from degradation level 2.
	DegradeMaxTokens int `env:"DEGRADE_MAX_TOKENS" bounds:"admission.DegradeConfig.MaxTokens"`
	// DegradeMinRequests is the fewest requests ended in the last minute before their failure rate counts toward a degradation level.
	DegradeMinRequests int `env:"DEGRADE_MIN_REQUESTS" bounds:"admission.DegradeConfig.MinRequests"`
	// DegradeProbeEvery admits one normal request in this many at degradation level 3.
	DegradeProbeEvery int `env:"DEGRADE_PROBE_EVERY" bounds:"admission.DegradeConfig.ProbeEvery"`
	// QueueRetryAfter is the upper bound of Retry-After on overflow.
	QueueRetryAfter time.Duration `env:"QUEUE_RETRY_AFTER_SECONDS" bounds:"admission.OverflowConfig.RetryAfterMax"`
	// QueueDepthCacheTTL is how often the backlog depth is refreshed.
	QueueDepthCacheTTL time.Duration `env:"QUEUE_DEPTH_CACHE_TTL_MS" bounds:"admission.OverflowConfig.RefreshEvery"`
	// QueueMaxPerIdentity is queued jobs per identity before 429 too-many-queued.
	QueueMaxPerIdentity int `env:"QUEUE_MAX_PER_IDENTITY" bounds:"admission.QuotaConfig.MaxPerIdentity"`
	// QueueMaxBytes bounds the bytes of the jobs waiting, cluster-wide, before 503 queue-overflow.
	QueueMaxBytes int64 `env:"QUEUE_MAX_BYTES"`
	// QueuePrefix prefixes every queue key and channel.
	QueuePrefix string `env:"QUEUE_PREFIX"`

	// WorkerConcurrency is jobs at once per consumer process.
	WorkerConcurrency int `env:"WORKER_CONCURRENCY" bounds:"worker.Config.Concurrency"`
	// WorkerHeartbeat is the worker to api heartbeat period.
	WorkerHeartbeat time.Duration `env:"WORKER_HEARTBEAT_SECONDS" bounds:"worker.Config.Heartbeat"`
	// EmbeddedWorkers runs workers inside the api. Default false, true in embedded mode.
	EmbeddedWorkers *bool `env:"EMBEDDED_WORKERS"`

	// ConnectionPoolSize is the global slot count. Default 100 (embedded: 2).
	ConnectionPoolSize int `env:"CONNECTION_POOL_SIZE" bounds:"redispool.Config.Size"`
	// ConnectionPoolPerUser is slots per identity.
	ConnectionPoolPerUser int `env:"CONNECTION_POOL_PER_USER" bounds:"redispool.Config.PerUser"`
	// PoolBackend is "local" or "redis". Default redis when RedisURL is set, else local.
	PoolBackend string `env:"POOL_BACKEND"`
	// PoolLeaseTTL is how long a Redis lease lives without renewal.
	PoolLeaseTTL time.Duration `env:"POOL_LEASE_TTL_SECONDS"`
	// PoolLocalFallbackSize is the local limit while Redis is unreachable.
	PoolLocalFallbackSize int `env:"POOL_LOCAL_FALLBACK_SIZE" bounds:"redispool.Config.FallbackSize"`
	// PoolIdleHold is how long a direct request's released Redis lease stays with its process for the same identity's next request; 0 releases at once.
	PoolIdleHold time.Duration `env:"POOL_IDLE_HOLD_MS" bounds:"redispool.Config.IdleHold"`
	// AdaptiveConcurrency lets the pool's limit toward the provider adapt (AIMD).
	AdaptiveConcurrency bool `env:"ADAPTIVE_CONCURRENCY"`
	// AdaptiveConcurrencyFloor is the lowest the adaptive limit goes.
	AdaptiveConcurrencyFloor int `env:"ADAPTIVE_CONCURRENCY_FLOOR" bounds:"adaptive.Params.Floor"`
	// AdaptiveFirstTokenTarget halves the limit when the first-token p99 of an interval exceeds it; 0 is off.
	AdaptiveFirstTokenTarget time.Duration `env:"ADAPTIVE_FIRST_TOKEN_TARGET_MS" bounds:"adaptive.Config.FirstTokenTarget"`
	// AdaptiveInterval is the adaptive limit's interval: at most one decrease per interval, +1 after each healthy one.
	AdaptiveInterval time.Duration `env:"ADAPTIVE_INTERVAL_MS" bounds:"adaptive.Params.Interval"`

	// HeartbeatInterval is the SSE `: ping` period.
	HeartbeatInterval time.Duration `env:"HEARTBEAT_INTERVAL_SECONDS" bounds:"stream.Config.Heartbeat"`
	// MaxBodyBytes bounds the request body; its default is 16 MiB because
	// images travel inline.
	MaxBodyBytes int64 `env:"MAX_BODY_BYTES"`
	// BodyBytesInFlight bounds the request-body bytes one api reads or
	// holds at once, over every request; a new request beyond it is
	// refused 503 bodies-in-flight. At least MAX_BODY_BYTES.
	BodyBytesInFlight int64 `env:"BODY_BYTES_IN_FLIGHT" bounds:"stream.Config.BodyBytesInFlight"`
	// MaxMessages bounds messages per request.
	MaxMessages int `env:"MAX_MESSAGES" bounds:"protocol.Limits.MaxMessages"`
	// MaxTokensLimit bounds max_tokens and max_completion_tokens; its
	// default is above every real model's output, below nonsense.
	MaxTokensLimit int `env:"MAX_TOKENS_LIMIT" bounds:"protocol.Limits.MaxTokens"`
	// MaxChoices bounds n, the choices one request asks for.
	MaxChoices int `env:"MAX_CHOICES" bounds:"protocol.Limits.MaxChoices"`
	// NonTextPartTokens is what one content part that is not text (an
	// image, audio, a file) counts in token estimates.
	NonTextPartTokens int `env:"NONTEXT_PART_TOKENS" bounds:"upstream.Config.NonTextPartTokens"`
	// ShutdownGrace is the drain time for open streams.
	ShutdownGrace time.Duration `env:"SHUTDOWN_GRACE_SECONDS"`
	// StreamLogTTL is how long a stream's event log (for resume)
	// lives after its last event.
	StreamLogTTL time.Duration `env:"STREAM_LOG_TTL_SECONDS" bounds:"streamlog.Config.TTL"`
	// StreamLogFlush is the longest a stream's event waits before it is
	// written to its log: what a resumed reader may lag by.
	StreamLogFlush time.Duration `env:"STREAM_LOG_FLUSH_MS" bounds:"streamlog.Config.FlushInterval"`
	// StreamResumeWindow is how long a stream whose client left
	// keeps generating for a resume; 0 cancels at once.
	StreamResumeWindow time.Duration `env:"STREAM_RESUME_WINDOW_SECONDS" bounds:"stream.Config.ResumeWindow"`
	// BodyReadTimeout bounds reading a request body.
	BodyReadTimeout time.Duration `env:"BODY_READ_TIMEOUT_SECONDS" bounds:"stream.Config.BodyReadTimeout"`
	// MaxConnections bounds the api's open client connections; more get 503.
	MaxConnections int `env:"MAX_CONNECTIONS"`
	// HTTPIdleTimeout is how long the api keeps an idle keep-alive
	// connection open. Its default is above the usual load balancer's 60 s, so
	// the balancer, not the api, closes a pooled connection first (an api
	// closing one the balancer is reusing costs a request a 502). At
	// MAX_CONNECTIONS the idle ones are closed first anyway.
	HTTPIdleTimeout time.Duration `env:"HTTP_IDLE_TIMEOUT_SECONDS"`

	// RateLimitRPS is requests per second per identity; 0 is off.
	RateLimitRPS float64 `env:"RATE_LIMIT_RPS" bounds:"admission.RateLimitConfig.RPS"`
	// RateLimitBurst is the burst per identity.
	RateLimitBurst int `env:"RATE_LIMIT_BURST" bounds:"admission.RateLimitConfig.Burst"`
	// APIKeys are accepted bearer keys, or sha256:<hex> digests of them,
	// each optionally ending in =high|normal|low; empty means no auth.
	APIKeys []string `env:"API_KEYS" envSeparator:","`
	// MetricsAuth is who may read /metrics on both processes: none (anyone
	// who reaches the port) or api-key (a bearer key of API_KEYS).
	MetricsAuth string `env:"METRICS_AUTH"`
	// PriorityMax is the highest X-Priority a caller without a key maximum may ask for.
	PriorityMax string `env:"PRIORITY_MAX"`
	// TrustUserIDHeader lets X-User-ID name the caller (under a key: scoped to it).
	TrustUserIDHeader bool `env:"TRUST_USER_ID_HEADER"`
	// TrustedProxies are the CIDRs whose X-Forwarded-For / X-Real-IP count.
	TrustedProxies []string `env:"TRUSTED_PROXIES" envSeparator:","`

	// BreakerFailures opens the provider's circuit after this many
	// failures in a row.
	BreakerFailures int `env:"BREAKER_FAILURES"`
	// BreakerWindow is the rolling window over which the circuit
	// counts its failure ratio.
	BreakerWindow time.Duration `env:"BREAKER_WINDOW_SECONDS"`
	// BreakerOpen is how long the circuit stays open before it lets
	// trial calls through.
	BreakerOpen time.Duration `env:"BREAKER_OPEN_SECONDS"`
	// BreakerHalfOpenRequests is how many trial calls run while the circuit
	// is half-open; that many successes close it.
	BreakerHalfOpenRequests int `env:"BREAKER_HALF_OPEN_REQUESTS"`

	// LLMProvider is "sim" or "openai".
	LLMProvider string `env:"LLM_PROVIDER"`
	// LLMBaseURL is the OpenAI-compatible base URL, e.g. http://127.0.0.1:8081/v1.
	LLMBaseURL string `env:"LLM_BASE_URL"`
	// LLMAPIKey is sent as a bearer token upstream.
	LLMAPIKey string `env:"LLM_API_KEY"`
	// LLMModels, when set, are the only models a request may ask for. Default empty (any).
	LLMModels []string `env:"LLM_MODELS" envSeparator:","`
	// LLMModel is the model sent upstream when a request names none, and
	// always listed by GET /v1/models. Default empty (the request is sent
	// without one).
	LLMModel string `env:"LLM_MODEL"`
	// ModelsCacheTTL is how long GET /v1/models serves the upstreams'
	// lists before asking them again; 0 asks on every request.
	ModelsCacheTTL time.Duration `env:"MODELS_CACHE_SECONDS" bounds:"models.Config.TTL"`
	// LLMFirstTokenTimeout is the longest wait for an upstream
	// call's first chunk.
	LLMFirstTokenTimeout time.Duration `env:"LLM_FIRST_TOKEN_TIMEOUT_SECONDS" bounds:"llm.OpenAIConfig.FirstTokenTimeout"`
	// LLMIdleTimeout is the longest silence between two chunks of an
	// upstream stream.
	LLMIdleTimeout time.Duration `env:"LLM_IDLE_TIMEOUT_SECONDS" bounds:"llm.OpenAIConfig.IdleTimeout"`
	// LLMTimeout optionally caps one whole upstream call; 0 means no
	// cap, so long answers are never cut.
	LLMTimeout time.Duration `env:"LLM_TIMEOUT_SECONDS"`
	// LLMRetryAfterMax caps how long an upstream 429/503 Retry-After
	// is honoured.
	LLMRetryAfterMax time.Duration `env:"LLM_RETRY_AFTER_MAX_SECONDS"`
	// LLMRouting picks one of several upstreams per call: least-loaded,
	// weighted, affinity or latency (docs/UPSTREAMS.md).
	LLMRouting string `env:"LLM_ROUTING"`
	// LLMUpstreamMaxConcurrency caps the calls in flight on each upstream of
	// the LLM_BASE_URL list, cluster-wide; 0 means only the pool bounds
	// them.
	LLMUpstreamMaxConcurrency int `env:"LLM_UPSTREAM_MAX_CONCURRENCY"`
	// LLMUpstreamMaxFails is how many consecutive retryable failures before
	// the first chunk make an upstream sit out.
	LLMUpstreamMaxFails int `env:"LLM_UPSTREAM_MAX_FAILS" bounds:"upstream.HealthConfig.MaxFails"`
	// LLMUpstreamCooldown is how long an ejected upstream sits out
	// before one probe or trial call decides whether it is back.
	LLMUpstreamCooldown time.Duration `env:"LLM_UPSTREAM_COOLDOWN_SECONDS" bounds:"upstream.HealthConfig.Cooldown"`
	// LLMAffinityBalance is how many times busier than the least loaded an
	// affinity choice may be (and at least 4 calls more) before the least
	// loaded wins.
	LLMAffinityBalance float64 `env:"LLM_AFFINITY_BALANCE" bounds:"upstream.Config.AffinityBalance"`
	// LLMUpstreamProbe is how often each upstream is probed
	// (GET {base_url}/models), one process at a time; 0 means passive
	// health only.
	LLMUpstreamProbe time.Duration `env:"LLM_UPSTREAM_PROBE_SECONDS" bounds:"upstream.Config.ProbeEvery"`
	// YAMLUpstreams is the settings file's `upstreams:` list, the other way
	// to give several upstreams (it has no env form).
	YAMLUpstreams []upstream.Spec
	// Upstreams is the resolved upstream list of LLM_PROVIDER=openai: one
	// per LLM_BASE_URL entry, or the YAML list, with API keys looked up.
	// Load fills it; nil with the simulator.
	Upstreams []upstream.Spec

	// SimFirstToken is the simulator's delay before the first chunk.
	SimFirstToken time.Duration `env:"SIM_FIRST_TOKEN_MS" bounds:"llm.SimConfig.FirstToken"`
	// SimTokenInterval is the simulator's delay between chunks.
	SimTokenInterval time.Duration `env:"SIM_TOKEN_MS" bounds:"llm.SimConfig.TokenInterval"`
	// SimTokens is chunks per simulated answer.
	SimTokens int `env:"SIM_TOKENS" bounds:"llm.SimConfig.Tokens"`
	// SimSeed makes the simulated text deterministic.
	SimSeed int64 `env:"SIM_SEED"`
	// SimFailRate is the share of simulated calls failing before the first chunk.
	SimFailRate float64 `env:"SIM_FAIL_RATE" bounds:"llm.SimConfig.FailRate"`
	// SimFailMidstreamRate is the share failing after some chunks.
	SimFailMidstreamRate float64 `env:"SIM_FAIL_MIDSTREAM_RATE" bounds:"llm.SimConfig.FailMidstreamRate"`

	// CORSAllowedOrigins lists the origins (scheme://host[:port]) whose
	// browser pages may call the api, or "*" for any. Default empty (no
	// CORS headers), "*" in embedded mode.
	CORSAllowedOrigins []string `env:"CORS_ALLOWED_ORIGINS" envSeparator:","`
	// ChatPageEnabled serves the built-in chat page at GET /.
	ChatPageEnabled bool `env:"CHAT_PAGE_ENABLED"`

	// LogLevel is debug, info, warn or error.
	LogLevel string `env:"LOG_LEVEL"`
}

// Redis deployment modes, as RedisMode reports them.
const (
	// RedisModeEmbedded is no Redis: an in-process miniredis.
	RedisModeEmbedded = "embedded"
	// RedisModeSingle is one Redis at REDIS_URL.
	RedisModeSingle = "single"
	// RedisModeCluster is a Redis Cluster seeded by REDIS_CLUSTER_ADDRS.
	RedisModeCluster = "cluster"
	// RedisModeSentinel is the primary named by REDIS_SENTINEL_ADDRS.
	RedisModeSentinel = "sentinel"
)

// RedisMode says which Redis the process uses. Validate refuses more than
// one of REDIS_URL, REDIS_CLUSTER_ADDRS and REDIS_SENTINEL_ADDRS; should
// several be set anyway, the first of that order wins.
func (c *Config) RedisMode() string {
	switch {
	case c.RedisURL != "":
		return RedisModeSingle
	case len(c.RedisClusterAddrs) > 0:
		return RedisModeCluster
	case len(c.RedisSentinelAddrs) > 0:
		return RedisModeSentinel
	}
	return RedisModeEmbedded
}

// Embedded reports whether the process runs without Redis (embedded mode):
// none of REDIS_URL, REDIS_CLUSTER_ADDRS and REDIS_SENTINEL_ADDRS is set.
func (c *Config) Embedded() bool { return c.RedisMode() == RedisModeEmbedded }

// WorkersInProcess reports whether the api should run queue workers itself.
func (c *Config) WorkersInProcess() bool {
	if c.EmbeddedWorkers != nil {
		return *c.EmbeddedWorkers
	}
	return c.Embedded()
}

// logLevels maps each LOG_LEVEL value (any case) to its slog level.
var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// SlogLevel returns LogLevel as a slog.Level; info for a value Validate
// would reject.
func (c *Config) SlogLevel() slog.Level {
	if l, ok := logLevels[strings.ToLower(c.LogLevel)]; ok {
		return l
	}
	return slog.LevelInfo
}
