package config

import (
	"reflect"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/llm/breaker"
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/llm/upstream/models"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/redisclient"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/streamlog"
)

// Defaults returns every setting at its default, before Load fills in the
// mode-dependent ones (CONNECTION_POOL_SIZE, POOL_BACKEND,
// CORS_ALLOWED_ORIGINS, EMBEDDED_WORKERS stay zero here). A setting a
// component uses takes that component's Default constant, so each default
// is written once; the rest belong to the processes themselves and are
// written here. docs/OPERATIONS.md and configs/spillway.yaml are held to
// these values by internal/docscheck.
func Defaults() Config {
	sim := llm.DefaultSimConfig()
	return Config{
		HTTPAddr:         ":8080",
		ConsumerHTTPAddr: ":9090",
		RedisDialTimeout: redisclient.DefaultDialTimeout,
		RedisTimeout:     redisclient.DefaultTimeout,
		RedisPoolTimeout: redisclient.DefaultPoolTimeout,
		RedisDownAfter:   redispool.DefaultDownAfter,
		QueueShards:      redisstream.DefaultShards,

		QueueType:              QueueTypeRedis,
		KafkaPartitions:        kafka.DefaultPartitions,
		KafkaReplicationFactor: kafka.DefaultReplicationFactor,

		QueueFailoverEnabled:           true,
		DirectPathEnabled:              true,
		QueueFailoverTimeout:           gateway.DefaultQueueTimeout,
		QueueFailoverMaxRetries:        worker.DefaultMaxRetries,
		QueueFailoverBaseDelay:         llm.DefaultBaseDelay,
		QueueFailoverMaxDelay:          llm.DefaultMaxDelay,
		QueueFailoverChunkBatchSize:    worker.DefaultBatchSize,
		QueueFailoverChunkBatchTimeout: worker.DefaultBatchTimeout,
		QueueReclaimIdle:               failover.DefaultReclaimIdle,
		DeadLetterMaxLen:               redisstream.DefaultDeadLetterMaxLen,
		DeadLetterTTL:                  failover.DefaultDeadLetterTTL,
		QueueOverflowThreshold:         admission.DefaultOverflowThreshold,
		QueueOverflowHysteresis:        admission.DefaultOverflowHysteresis,
		QueueShedLowFraction:           admission.DefaultShedLowFraction,
		QueueShedNormalFraction:        admission.DefaultShedNormalFraction,
		PriorityAging:                  protocol.DefaultPriorityAging,
		DegradeMaxTokens:               admission.DefaultDegradeMaxTokens,
		DegradeMinRequests:             admission.DefaultDegradeMinRequests,
		DegradeProbeEvery:              admission.DefaultDegradeProbeEvery,
		QueueRetryAfter:                admission.DefaultOverflowRetryAfterMax,
		QueueDepthCacheTTL:             admission.DefaultOverflowRefreshEvery,
		QueueMaxPerIdentity:            admission.DefaultQueueMaxPerIdentity,
		QueueMaxBytes:                  admission.DefaultQueueMaxBytes,
		QueuePrefix:                    redisstream.DefaultPrefix,

		WorkerConcurrency: worker.DefaultConcurrency,
		WorkerHeartbeat:   worker.DefaultHeartbeat,

		ConnectionPoolPerUser:    pool.DefaultPerUser,
		PoolLeaseTTL:             redispool.DefaultLeaseTTL,
		PoolLocalFallbackSize:    redispool.DefaultFallbackSize,
		PoolIdleHold:             redispool.DefaultIdleHold,
		AdaptiveConcurrencyFloor: adaptive.DefaultFloor,
		AdaptiveInterval:         adaptive.DefaultInterval,

		HeartbeatInterval:  stream.DefaultHeartbeat,
		MaxBodyBytes:       stream.DefaultMaxBodyBytes,
		BodyBytesInFlight:  stream.DefaultBodyBytesInFlight,
		MaxMessages:        protocol.DefaultLimits.MaxMessages,
		MaxTokensLimit:     protocol.DefaultLimits.MaxTokens,
		MaxChoices:         protocol.DefaultLimits.MaxChoices,
		NonTextPartTokens:  upstream.DefaultNonTextPartTokens,
		ShutdownGrace:      worker.DefaultStopGrace,
		StreamLogTTL:       streamlog.DefaultTTL,
		StreamLogFlush:     streamlog.DefaultFlushInterval,
		StreamResumeWindow: stream.DefaultResumeWindow,
		BodyReadTimeout:    stream.DefaultBodyReadTimeout,
		MaxConnections:     20000,
		HTTPIdleTimeout:    120 * time.Second,

		MetricsAuth:       MetricsAuthNone,
		PriorityMax:       string(protocol.PriorityNormal),
		TrustUserIDHeader: true,

		BreakerFailures:         breaker.DefaultFailures,
		BreakerWindow:           breaker.DefaultWindow,
		BreakerOpen:             breaker.DefaultOpenTimeout,
		BreakerHalfOpenRequests: breaker.DefaultHalfOpenRequests,

		LLMProvider:          ProviderSim,
		ModelsCacheTTL:       models.DefaultTTL,
		LLMFirstTokenTimeout: llm.DefaultFirstTokenTimeout,
		LLMIdleTimeout:       llm.DefaultIdleTimeout,
		LLMRetryAfterMax:     llm.DefaultRetryAfterMax,
		LLMRouting:           upstream.RoutingLeastLoaded,
		LLMUpstreamMaxFails:  upstream.DefaultMaxFails,
		LLMUpstreamCooldown:  upstream.DefaultCooldown,
		LLMAffinityBalance:   upstream.DefaultAffinityBalance,

		SimFirstToken:        sim.FirstToken,
		SimTokenInterval:     sim.TokenInterval,
		SimTokens:            sim.Tokens,
		SimSeed:              sim.Seed,
		SimFailRate:          sim.FailRate,
		SimFailMidstreamRate: sim.FailMidstreamRate,

		ChatPageEnabled: true,
		LogLevel:        "info",
	}
}

// DefaultValues returns the default of every setting that has one as it
// would be written in env (a duration as a whole number in the unit its
// name ends in), keyed by env name. Settings without a default, and the
// mode-dependent ones Load fills in, are left out.
func DefaultValues() map[string]string {
	d := Defaults()
	rv := reflect.ValueOf(d)
	out := make(map[string]string)
	for field, name := range envVars {
		f := rv.FieldByName(field)
		switch {
		case f.Type() == reflect.TypeFor[time.Duration]():
			out[name] = inUnit(name, time.Duration(f.Int()))
		case modeDependent[name]:
		case f.Kind() == reflect.String:
			if f.String() != "" {
				out[name] = f.String()
			}
		case f.Kind() == reflect.Bool:
			out[name] = strconv.FormatBool(f.Bool())
		case f.CanInt():
			out[name] = strconv.FormatInt(f.Int(), 10)
		case f.CanFloat():
			out[name] = strconv.FormatFloat(f.Float(), 'g', -1, 64)
		}
	}
	return out
}

// modeDependent are the settings whose default depends on the Redis mode;
// Load fills them in (docs/OPERATIONS.md states both values).
var modeDependent = map[string]bool{
	"CONNECTION_POOL_SIZE": true, "POOL_BACKEND": true,
	"CORS_ALLOWED_ORIGINS": true, "EMBEDDED_WORKERS": true,
}
