// Package config owns Spillway's one typed configuration: its defaults, how
// it is read from the environment and an optional YAML file (env wins), and
// its validation at start.
package config

import (
	"github.com/spillway-dev/spillway/internal/upstream"

	"log/slog"
	"strings"
	"time"
)

// Config is every setting of the api, consumer and simllm processes. Env
// names and defaults are the contract in docs/OPERATIONS.md, "Settings"; the yaml key of each
// field is its env name in lower case.
type Config struct {
	// HTTPAddr is the api listen address. Default ":8080".
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8080"`
	// ConsumerHTTPAddr serves the consumer's /metrics and /healthz. Default ":9090".
	ConsumerHTTPAddr string `env:"CONSUMER_HTTP_ADDR" envDefault:":9090"`
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
	// RedisPoolSize is the go-redis connections per Redis node. Default 0:
	// max(64, 2×WorkerConcurrency+8).
	RedisPoolSize int `env:"REDIS_POOL_SIZE" envDefault:"0"`
	// RedisMinIdleConns are kept open per node so a burst does not dial.
	// Default 0 (opened on demand).
	RedisMinIdleConns int `env:"REDIS_MIN_IDLE_CONNS" envDefault:"0"`
	// RedisDialTimeoutMS bounds opening a connection. Default 1000.
	RedisDialTimeoutMS int `env:"REDIS_DIAL_TIMEOUT_MS" envDefault:"1000"`
	// RedisTimeoutMS bounds one read or write on a connection. Default 3000.
	RedisTimeoutMS int `env:"REDIS_TIMEOUT_MS" envDefault:"3000"`
	// RedisPoolTimeoutMS bounds the wait for a free connection when all
	// are busy. Default 1000.
	RedisPoolTimeoutMS int `env:"REDIS_POOL_TIMEOUT_MS" envDefault:"1000"`
	// RedisDownAfterMS is how long Redis may leave the health probe
	// unanswered, after a call timed out, before it counts as down (the
	// pool's fallback). Default 3000.
	RedisDownAfterMS int `env:"REDIS_DOWN_AFTER_MS" envDefault:"3000"`
	// QueueShards splits the Redis Streams queue over this many streams,
	// 1 to 64. Default 1.
	QueueShards int `env:"QUEUE_SHARDS" envDefault:"1"`

	// QueueType is "redis" or "kafka". Default "redis".
	QueueType string `env:"QUEUE_TYPE" envDefault:"redis"`
	// KafkaBrokers lists host:port brokers, needed when QueueType is kafka.
	KafkaBrokers []string `env:"KAFKA_BROKERS" envSeparator:","`
	// KafkaPartitions is the partition count used when the topic is created. Default 4.
	KafkaPartitions int `env:"KAFKA_PARTITIONS" envDefault:"4"`
	// KafkaReplicationFactor is used when the topic is created. Default 1.
	KafkaReplicationFactor int `env:"KAFKA_REPLICATION_FACTOR" envDefault:"1"`

	// QueueFailoverEnabled off makes a full pool answer 503. Default true.
	QueueFailoverEnabled bool `env:"QUEUE_FAILOVER_ENABLED" envDefault:"true"`
	// DirectPathEnabled off sends every request through the queue. Default true.
	DirectPathEnabled bool `env:"DIRECT_PATH_ENABLED" envDefault:"true"`
	// QueueFailoverTimeoutSeconds is the longest wait for a worker to start a job. Default 30.
	QueueFailoverTimeoutSeconds int `env:"QUEUE_FAILOVER_TIMEOUT_SECONDS" envDefault:"30"`
	// QueueFailoverMaxRetries is provider retries before dead-letter. Default 5.
	QueueFailoverMaxRetries int `env:"QUEUE_FAILOVER_MAX_RETRIES" envDefault:"5"`
	// QueueFailoverBaseDelayMS is the first backoff delay. Default 100.
	QueueFailoverBaseDelayMS int `env:"QUEUE_FAILOVER_BASE_DELAY_MS" envDefault:"100"`
	// QueueFailoverMaxDelayMS caps the backoff delay. Default 5000.
	QueueFailoverMaxDelayMS int `env:"QUEUE_FAILOVER_MAX_DELAY_MS" envDefault:"5000"`
	// QueueFailoverChunkBatchSize is chunks per published batch. Default 5.
	QueueFailoverChunkBatchSize int `env:"QUEUE_FAILOVER_CHUNK_BATCH_SIZE" envDefault:"5"`
	// QueueFailoverChunkBatchTimeoutMS flushes a partial batch after this long. Default 100.
	QueueFailoverChunkBatchTimeoutMS int `env:"QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS" envDefault:"100"`
	// QueueReclaimIdleSeconds is how long a job may sit idle before another worker takes it over. Default 15.
	QueueReclaimIdleSeconds int `env:"QUEUE_RECLAIM_IDLE_SECONDS" envDefault:"15"`
	// DeadLetterMaxLen bounds each dead-letter stream (XADD MAXLEN ~); Kafka has no count bound. Default 10000.
	DeadLetterMaxLen int `env:"DEAD_LETTER_MAX_LEN" envDefault:"10000"`
	// DeadLetterTTLHours is how long the dead-letter stream lives after its last record, and the
	// Kafka dead-letter topic's retention. Default 168.
	DeadLetterTTLHours int `env:"DEAD_LETTER_TTL_HOURS" envDefault:"168"`
	// DeadLetterKeepPayload stores the job's prompt in a dead letter (both queues); false keeps a
	// digest and sizes only. Default false.
	DeadLetterKeepPayload bool `env:"DEAD_LETTER_KEEP_PAYLOAD" envDefault:"false"`
	// QueueOverflowThreshold is the backlog at which queued requests get 503. Default 10000.
	QueueOverflowThreshold int `env:"QUEUE_OVERFLOW_THRESHOLD" envDefault:"10000"`
	// QueueOverflowHysteresis is how far below the threshold the backlog must fall before accepting again. Default 500.
	QueueOverflowHysteresis int `env:"QUEUE_OVERFLOW_HYSTERESIS" envDefault:"500"`
	// QueueShedLowFraction is the share of the threshold from which low-priority requests get 503. Default 0.5.
	QueueShedLowFraction float64 `env:"QUEUE_SHED_LOW_FRACTION" envDefault:"0.5"`
	// QueueShedNormalFraction is the share of the threshold from which normal requests get 503. Default 0.8.
	QueueShedNormalFraction float64 `env:"QUEUE_SHED_NORMAL_FRACTION" envDefault:"0.8"`
	// PriorityAgingSeconds is how long a queued job waits to count one priority level higher. Default 30.
	PriorityAgingSeconds int `env:"PRIORITY_AGING_SECONDS" envDefault:"30"`
	// DegradeMaxTokens caps a normal request's max_tokens from degradation level 2. Default 1024.
	DegradeMaxTokens int `env:"DEGRADE_MAX_TOKENS" envDefault:"1024"`
	// DegradeMinRequests is the fewest requests ended in the last minute before their failure rate counts toward a degradation level. Default 20.
	DegradeMinRequests int `env:"DEGRADE_MIN_REQUESTS" envDefault:"20"`
	// DegradeProbeEvery admits one normal request in this many at degradation level 3. Default 10.
	DegradeProbeEvery int `env:"DEGRADE_PROBE_EVERY" envDefault:"10"`
	// QueueRetryAfterSeconds is the upper bound of Retry-After on overflow. Default 60.
	QueueRetryAfterSeconds int `env:"QUEUE_RETRY_AFTER_SECONDS" envDefault:"60"`
	// QueueDepthCacheTTLMS is how often the backlog depth is refreshed. Default 1000.
	QueueDepthCacheTTLMS int `env:"QUEUE_DEPTH_CACHE_TTL_MS" envDefault:"1000"`
	// QueueMaxPerIdentity is queued jobs per identity before 429 too-many-queued. Default 100.
	QueueMaxPerIdentity int `env:"QUEUE_MAX_PER_IDENTITY" envDefault:"100"`
	// QueueMaxBytes bounds the bytes of the jobs waiting, cluster-wide, before 503 queue-overflow. Default 268435456 (256 MiB).
	QueueMaxBytes int64 `env:"QUEUE_MAX_BYTES" envDefault:"268435456"`
	// QueuePrefix prefixes every queue key and channel. Default "queue:".
	QueuePrefix string `env:"QUEUE_PREFIX" envDefault:"queue:"`

	// WorkerConcurrency is jobs at once per consumer process. Default 16.
	WorkerConcurrency int `env:"WORKER_CONCURRENCY" envDefault:"16"`
	// WorkerHeartbeatSeconds is the worker to api heartbeat period. Default 5.
	WorkerHeartbeatSeconds int `env:"WORKER_HEARTBEAT_SECONDS" envDefault:"5"`
	// EmbeddedWorkers runs workers inside the api. Default false, true in embedded mode.
	EmbeddedWorkers *bool `env:"EMBEDDED_WORKERS"`

	// ConnectionPoolSize is the global slot count. Default 100 (embedded: 2).
	ConnectionPoolSize int `env:"CONNECTION_POOL_SIZE"`
	// ConnectionPoolPerUser is slots per identity. Default 5.
	ConnectionPoolPerUser int `env:"CONNECTION_POOL_PER_USER" envDefault:"5"`
	// PoolBackend is "local" or "redis". Default redis when RedisURL is set, else local.
	PoolBackend string `env:"POOL_BACKEND"`
	// PoolLeaseTTLSeconds is how long a Redis lease lives without renewal. Default 30.
	PoolLeaseTTLSeconds int `env:"POOL_LEASE_TTL_SECONDS" envDefault:"30"`
	// PoolLocalFallbackSize is the local limit while Redis is unreachable. Default 10.
	PoolLocalFallbackSize int `env:"POOL_LOCAL_FALLBACK_SIZE" envDefault:"10"`
	// PoolIdleHoldMS is how long a direct request's released Redis lease stays with its process for the same identity's next request; 0 releases at once. Default 200.
	PoolIdleHoldMS int `env:"POOL_IDLE_HOLD_MS" envDefault:"200"`
	// AdaptiveConcurrency lets the pool's limit toward the provider adapt (AIMD). Default false.
	AdaptiveConcurrency bool `env:"ADAPTIVE_CONCURRENCY" envDefault:"false"`
	// AdaptiveConcurrencyFloor is the lowest the adaptive limit goes. Default 1.
	AdaptiveConcurrencyFloor int `env:"ADAPTIVE_CONCURRENCY_FLOOR" envDefault:"1"`
	// AdaptiveFirstTokenTargetMS halves the limit when the first-token p99 of an interval exceeds it; 0 is off. Default 0.
	AdaptiveFirstTokenTargetMS int `env:"ADAPTIVE_FIRST_TOKEN_TARGET_MS" envDefault:"0"`
	// AdaptiveIntervalMS is the adaptive limit's interval: at most one decrease per interval, +1 after each healthy one. Default 1000.
	AdaptiveIntervalMS int `env:"ADAPTIVE_INTERVAL_MS" envDefault:"1000"`

	// HeartbeatIntervalSeconds is the SSE `: ping` period. Default 15.
	HeartbeatIntervalSeconds int `env:"HEARTBEAT_INTERVAL_SECONDS" envDefault:"15"`
	// MaxBodyBytes bounds the request body. Default 16777216 (16 MiB:
	// images travel inline).
	MaxBodyBytes int64 `env:"MAX_BODY_BYTES" envDefault:"16777216"`
	// BodyBytesInFlight bounds the request-body bytes one api reads or
	// holds at once, over every request; a new request beyond it is
	// refused 503 bodies-in-flight. Default 268435456 (256 MiB); at least
	// MAX_BODY_BYTES.
	BodyBytesInFlight int64 `env:"BODY_BYTES_IN_FLIGHT" envDefault:"268435456"`
	// MaxMessages bounds messages per request. Default 1000.
	MaxMessages int `env:"MAX_MESSAGES" envDefault:"1000"`
	// MaxTokensLimit bounds max_tokens and max_completion_tokens. Default
	// 1048576: above every real model's output, below nonsense.
	MaxTokensLimit int `env:"MAX_TOKENS_LIMIT" envDefault:"1048576"`
	// MaxChoices bounds n, the choices one request asks for. Default 8.
	MaxChoices int `env:"MAX_CHOICES" envDefault:"8"`
	// NonTextPartTokens is what one content part that is not text (an
	// image, audio, a file) counts in token estimates. Default 1000.
	NonTextPartTokens int `env:"NONTEXT_PART_TOKENS" envDefault:"1000"`
	// ShutdownGraceSeconds is the drain time for open streams. Default 25.
	ShutdownGraceSeconds int `env:"SHUTDOWN_GRACE_SECONDS" envDefault:"25"`
	// StreamLogTTLSeconds is how long a stream's event log (for resume)
	// lives after its last event. Default 300.
	StreamLogTTLSeconds int `env:"STREAM_LOG_TTL_SECONDS" envDefault:"300"`
	// StreamResumeWindowSeconds is how long a stream whose client left
	// keeps generating for a resume; 0 cancels at once. Default 10.
	StreamResumeWindowSeconds int `env:"STREAM_RESUME_WINDOW_SECONDS" envDefault:"10"`
	// BodyReadTimeoutSeconds bounds reading a request body. Default 10.
	BodyReadTimeoutSeconds int `env:"BODY_READ_TIMEOUT_SECONDS" envDefault:"10"`
	// MaxConnections bounds the api's open client connections; more get 503. Default 20000.
	MaxConnections int `env:"MAX_CONNECTIONS" envDefault:"20000"`
	// HTTPIdleTimeoutSeconds is how long the api keeps an idle keep-alive
	// connection open. Default 120: above the usual load balancer's 60 s, so
	// the balancer, not the api, closes a pooled connection first (an api
	// closing one the balancer is reusing costs a request a 502). At
	// MAX_CONNECTIONS the idle ones are closed first anyway.
	HTTPIdleTimeoutSeconds int `env:"HTTP_IDLE_TIMEOUT_SECONDS" envDefault:"120"`

	// RateLimitRPS is requests per second per identity; 0 is off. Default 0.
	RateLimitRPS float64 `env:"RATE_LIMIT_RPS" envDefault:"0"`
	// RateLimitBurst is the burst per identity. Default 0.
	RateLimitBurst int `env:"RATE_LIMIT_BURST" envDefault:"0"`
	// APIKeys are accepted bearer keys, or sha256:<hex> digests of them,
	// each optionally ending in =high|normal|low; empty means no auth.
	APIKeys []string `env:"API_KEYS" envSeparator:","`
	// MetricsAuth is who may read /metrics on both processes: none (anyone
	// who reaches the port) or api-key (a bearer key of API_KEYS). Default none.
	MetricsAuth string `env:"METRICS_AUTH" envDefault:"none"`
	// PriorityMax is the highest X-Priority a caller without a key maximum may ask for. Default normal.
	PriorityMax string `env:"PRIORITY_MAX" envDefault:"normal"`
	// TrustUserIDHeader lets X-User-ID name the caller (under a key: scoped to it). Default true.
	TrustUserIDHeader bool `env:"TRUST_USER_ID_HEADER" envDefault:"true"`
	// TrustedProxies are the CIDRs whose X-Forwarded-For / X-Real-IP count. Default empty.
	TrustedProxies []string `env:"TRUSTED_PROXIES" envSeparator:","`

	// BreakerFailures opens the provider's circuit after this many
	// failures in a row. Default 5.
	BreakerFailures int `env:"BREAKER_FAILURES" envDefault:"5"`
	// BreakerWindowSeconds is the rolling window over which the circuit
	// counts its failure ratio. Default 60.
	BreakerWindowSeconds int `env:"BREAKER_WINDOW_SECONDS" envDefault:"60"`
	// BreakerOpenSeconds is how long the circuit stays open before it lets
	// trial calls through. Default 30.
	BreakerOpenSeconds int `env:"BREAKER_OPEN_SECONDS" envDefault:"30"`
	// BreakerHalfOpenRequests is how many trial calls run while the circuit
	// is half-open; that many successes close it. Default 3.
	BreakerHalfOpenRequests int `env:"BREAKER_HALF_OPEN_REQUESTS" envDefault:"3"`

	// LLMProvider is "sim" or "openai". Default "sim".
	LLMProvider string `env:"LLM_PROVIDER" envDefault:"sim"`
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
	// ModelsCacheSeconds is how long GET /v1/models serves the upstreams'
	// lists before asking them again; 0 asks on every request. Default 60
	// (models.DefaultTTL).
	ModelsCacheSeconds int `env:"MODELS_CACHE_SECONDS" envDefault:"60"`
	// LLMFirstTokenTimeoutSeconds is the longest wait for an upstream
	// call's first chunk. Default 60.
	LLMFirstTokenTimeoutSeconds int `env:"LLM_FIRST_TOKEN_TIMEOUT_SECONDS" envDefault:"60"`
	// LLMIdleTimeoutSeconds is the longest silence between two chunks of an
	// upstream stream. Default 30.
	LLMIdleTimeoutSeconds int `env:"LLM_IDLE_TIMEOUT_SECONDS" envDefault:"30"`
	// LLMTimeoutSeconds optionally caps one whole upstream call; 0 means no
	// cap, so long answers are never cut. Default 0.
	LLMTimeoutSeconds int `env:"LLM_TIMEOUT_SECONDS" envDefault:"0"`
	// LLMRetryAfterMaxSeconds caps how long an upstream 429/503 Retry-After
	// is honoured. Default 30.
	LLMRetryAfterMaxSeconds int `env:"LLM_RETRY_AFTER_MAX_SECONDS" envDefault:"30"`
	// LLMRouting picks one of several upstreams per call: least-loaded,
	// weighted, affinity or latency (docs/UPSTREAMS.md). Default
	// least-loaded.
	LLMRouting string `env:"LLM_ROUTING" envDefault:"least-loaded"`
	// LLMUpstreamMaxConcurrency caps the calls in flight on each upstream of
	// the LLM_BASE_URL list, cluster-wide; 0 means only the pool bounds
	// them. Default 0.
	LLMUpstreamMaxConcurrency int `env:"LLM_UPSTREAM_MAX_CONCURRENCY" envDefault:"0"`
	// LLMUpstreamMaxFails is how many consecutive retryable failures before
	// the first chunk make an upstream sit out. Default 3.
	LLMUpstreamMaxFails int `env:"LLM_UPSTREAM_MAX_FAILS" envDefault:"3"`
	// LLMUpstreamCooldownSeconds is how long an ejected upstream sits out
	// before one probe or trial call decides whether it is back. Default 30.
	LLMUpstreamCooldownSeconds int `env:"LLM_UPSTREAM_COOLDOWN_SECONDS" envDefault:"30"`
	// LLMAffinityBalance is how many times busier than the least loaded an
	// affinity choice may be (and at least 4 calls more) before the least
	// loaded wins. Default 1.5.
	LLMAffinityBalance float64 `env:"LLM_AFFINITY_BALANCE" envDefault:"1.5"`
	// LLMUpstreamProbeSeconds is how often each upstream is probed
	// (GET {base_url}/models), one process at a time; 0 means passive
	// health only. Default 0.
	LLMUpstreamProbeSeconds int `env:"LLM_UPSTREAM_PROBE_SECONDS" envDefault:"0"`
	// YAMLUpstreams is the settings file's `upstreams:` list, the other way
	// to give several upstreams (it has no env form).
	YAMLUpstreams []upstream.Spec
	// Upstreams is the resolved upstream list of LLM_PROVIDER=openai: one
	// per LLM_BASE_URL entry, or the YAML list, with API keys looked up.
	// Load fills it; nil with the simulator.
	Upstreams []upstream.Spec

	// SimFirstTokenMS is the simulator's delay before the first chunk. Default 150.
	SimFirstTokenMS int `env:"SIM_FIRST_TOKEN_MS" envDefault:"150"`
	// SimTokenMS is the simulator's delay between chunks. Default 20.
	SimTokenMS int `env:"SIM_TOKEN_MS" envDefault:"20"`
	// SimTokens is chunks per simulated answer. Default 48.
	SimTokens int `env:"SIM_TOKENS" envDefault:"48"`
	// SimSeed makes the simulated text deterministic. Default 1.
	SimSeed int64 `env:"SIM_SEED" envDefault:"1"`
	// SimFailRate is the share of simulated calls failing before the first chunk. Default 0.
	SimFailRate float64 `env:"SIM_FAIL_RATE" envDefault:"0"`
	// SimFailMidstreamRate is the share failing after some chunks. Default 0.
	SimFailMidstreamRate float64 `env:"SIM_FAIL_MIDSTREAM_RATE" envDefault:"0"`

	// CORSAllowedOrigins lists the origins (scheme://host[:port]) whose
	// browser pages may call the api, or "*" for any. Default empty (no
	// CORS headers), "*" in embedded mode.
	CORSAllowedOrigins []string `env:"CORS_ALLOWED_ORIGINS" envSeparator:","`
	// ChatPageEnabled serves the built-in chat page at GET /. Default true.
	ChatPageEnabled bool `env:"CHAT_PAGE_ENABLED" envDefault:"true"`

	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
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

// HeartbeatInterval is the SSE `: ping` period (HEARTBEAT_INTERVAL_SECONDS).
func (c *Config) HeartbeatInterval() time.Duration { return seconds(c.HeartbeatIntervalSeconds) }

// QueueFailoverTimeout is the longest wait for a worker to start a job
// (QUEUE_FAILOVER_TIMEOUT_SECONDS).
func (c *Config) QueueFailoverTimeout() time.Duration {
	return seconds(c.QueueFailoverTimeoutSeconds)
}

// WorkerHeartbeat is the worker to api heartbeat period (WORKER_HEARTBEAT_SECONDS).
func (c *Config) WorkerHeartbeat() time.Duration { return seconds(c.WorkerHeartbeatSeconds) }

// QueueReclaimIdle is how long a job may sit idle before another worker takes
// it over (QUEUE_RECLAIM_IDLE_SECONDS).
func (c *Config) QueueReclaimIdle() time.Duration { return seconds(c.QueueReclaimIdleSeconds) }

// DeadLetterTTL is DEAD_LETTER_TTL_HOURS as a duration.
func (c *Config) DeadLetterTTL() time.Duration {
	return time.Duration(c.DeadLetterTTLHours) * time.Hour
}

// QueueRetryAfter is the upper bound of Retry-After on overflow
// (QUEUE_RETRY_AFTER_SECONDS).
func (c *Config) QueueRetryAfter() time.Duration { return seconds(c.QueueRetryAfterSeconds) }

// ModelsCacheTTL is MODELS_CACHE_SECONDS.
func (c *Config) ModelsCacheTTL() time.Duration { return seconds(c.ModelsCacheSeconds) }

// StreamLogTTL is STREAM_LOG_TTL_SECONDS.
func (c *Config) StreamLogTTL() time.Duration { return seconds(c.StreamLogTTLSeconds) }

// StreamResumeWindow is STREAM_RESUME_WINDOW_SECONDS.
func (c *Config) StreamResumeWindow() time.Duration { return seconds(c.StreamResumeWindowSeconds) }

// HTTPIdleTimeout is how long an idle keep-alive connection stays open
// (HTTP_IDLE_TIMEOUT_SECONDS).
func (c *Config) HTTPIdleTimeout() time.Duration { return seconds(c.HTTPIdleTimeoutSeconds) }

// BodyReadTimeout bounds reading a request body (BODY_READ_TIMEOUT_SECONDS).
func (c *Config) BodyReadTimeout() time.Duration { return seconds(c.BodyReadTimeoutSeconds) }

// ShutdownGrace is the drain time for open streams (SHUTDOWN_GRACE_SECONDS).
func (c *Config) ShutdownGrace() time.Duration { return seconds(c.ShutdownGraceSeconds) }

// BatchTimeout flushes a partial chunk batch after this long
// (QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS).
func (c *Config) BatchTimeout() time.Duration { return millis(c.QueueFailoverChunkBatchTimeoutMS) }

// BaseDelay is the first retry backoff (QUEUE_FAILOVER_BASE_DELAY_MS).
func (c *Config) BaseDelay() time.Duration { return millis(c.QueueFailoverBaseDelayMS) }

// MaxDelay caps the retry backoff (QUEUE_FAILOVER_MAX_DELAY_MS).
func (c *Config) MaxDelay() time.Duration { return millis(c.QueueFailoverMaxDelayMS) }

// DepthCacheTTL is how often the queue depth is refreshed (QUEUE_DEPTH_CACHE_TTL_MS).
func (c *Config) DepthCacheTTL() time.Duration { return millis(c.QueueDepthCacheTTLMS) }

// PriorityAging is how long a queued job waits to count one priority
// level higher (PRIORITY_AGING_SECONDS).
func (c *Config) PriorityAging() time.Duration { return seconds(c.PriorityAgingSeconds) }

// AdaptiveInterval is ADAPTIVE_INTERVAL_MS as a duration.
func (c *Config) AdaptiveInterval() time.Duration { return millis(c.AdaptiveIntervalMS) }

// AdaptiveFirstTokenTarget is ADAPTIVE_FIRST_TOKEN_TARGET_MS as a
// duration; 0 is off.
func (c *Config) AdaptiveFirstTokenTarget() time.Duration {
	return millis(c.AdaptiveFirstTokenTargetMS)
}

// LeaseTTL is how long a Redis pool lease lives without renewal
// (POOL_LEASE_TTL_SECONDS).
func (c *Config) LeaseTTL() time.Duration { return seconds(c.PoolLeaseTTLSeconds) }

// LLMTimeout optionally caps one upstream provider call; 0 means no cap
// (LLM_TIMEOUT_SECONDS).
func (c *Config) LLMTimeout() time.Duration { return seconds(c.LLMTimeoutSeconds) }

// LLMFirstTokenTimeout is the longest wait for an upstream call's first
// chunk (LLM_FIRST_TOKEN_TIMEOUT_SECONDS).
func (c *Config) LLMFirstTokenTimeout() time.Duration { return seconds(c.LLMFirstTokenTimeoutSeconds) }

// LLMIdleTimeout is the longest silence between two chunks of an upstream
// stream (LLM_IDLE_TIMEOUT_SECONDS).
func (c *Config) LLMIdleTimeout() time.Duration { return seconds(c.LLMIdleTimeoutSeconds) }

// LLMRetryAfterMax caps an upstream Retry-After and the throttled backoff
// (LLM_RETRY_AFTER_MAX_SECONDS).
func (c *Config) LLMRetryAfterMax() time.Duration { return seconds(c.LLMRetryAfterMaxSeconds) }

// SimFirstToken is the simulator's delay before the first chunk (SIM_FIRST_TOKEN_MS).
func (c *Config) SimFirstToken() time.Duration { return millis(c.SimFirstTokenMS) }

// SimTokenInterval is the simulator's delay between chunks (SIM_TOKEN_MS).
func (c *Config) SimTokenInterval() time.Duration { return millis(c.SimTokenMS) }

// LLMUpstreamCooldown is LLM_UPSTREAM_COOLDOWN_SECONDS as a duration.
func (c *Config) LLMUpstreamCooldown() time.Duration {
	return time.Duration(c.LLMUpstreamCooldownSeconds) * time.Second
}

// LLMUpstreamProbe is LLM_UPSTREAM_PROBE_SECONDS as a duration; 0 is off.
func (c *Config) LLMUpstreamProbe() time.Duration {
	return time.Duration(c.LLMUpstreamProbeSeconds) * time.Second
}

// BreakerWindow is BREAKER_WINDOW_SECONDS as a duration.
func (c *Config) BreakerWindow() time.Duration { return seconds(c.BreakerWindowSeconds) }

// BreakerOpen is BREAKER_OPEN_SECONDS as a duration.
func (c *Config) BreakerOpen() time.Duration { return seconds(c.BreakerOpenSeconds) }

func seconds(n int) time.Duration { return time.Duration(n) * time.Second }

func millis(n int) time.Duration { return time.Duration(n) * time.Millisecond }
