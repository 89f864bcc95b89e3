package config

import (
	"github.com/spillway-dev/spillway/internal/llm/upstream"
	"github.com/spillway-dev/spillway/internal/llm/upstream/models"

	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

const exampleFile = "../../configs/spillway.yaml"

func mustLoad(tb testing.TB, path string, environ map[string]string) *Config {
	tb.Helper()
	c, err := Load(path, environ)
	if err != nil {
		tb.Fatalf("Load(%q, %v): %v", path, environ, err)
	}
	return c
}

func writeFile(tb testing.TB, text string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "spillway.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// errVars returns the Var of every *FieldError in err's tree, sorted.
func errVars(err error) []string {
	var vars []string
	var walk func(error)
	walk = func(e error) {
		if fe, ok := e.(*FieldError); ok {
			vars = append(vars, fe.Var)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			if x := u.Unwrap(); x != nil {
				walk(x)
			}
		}
	}
	walk(err)
	slices.Sort(vars)
	return vars
}

func allVars() []string { return slices.Sorted(maps.Keys(knownVars)) }

func ptr[T any](v T) *T { return &v }

func TestDefaults(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, "", nil)

	// One row per setting, values from docs/OPERATIONS.md's settings table.
	rows := []struct {
		name      string
		got, want any
	}{
		{"HTTP_ADDR", c.HTTPAddr, ":8080"},
		{"CONSUMER_HTTP_ADDR", c.ConsumerHTTPAddr, ":9090"},
		{"REDIS_URL", c.RedisURL, ""},
		{"REDIS_CLUSTER_ADDRS", c.RedisClusterAddrs, []string(nil)},
		{"REDIS_SENTINEL_ADDRS", c.RedisSentinelAddrs, []string(nil)},
		{"REDIS_SENTINEL_MASTER", c.RedisSentinelMaster, ""},
		{"REDIS_SENTINEL_PASSWORD", c.RedisSentinelPassword, ""},
		{"REDIS_PASSWORD", c.RedisPassword, ""},
		{"QUEUE_SHARDS", c.QueueShards, 1},
		{"QUEUE_TYPE", c.QueueType, "redis"},
		{"KAFKA_BROKERS", c.KafkaBrokers, []string(nil)},
		{"KAFKA_PARTITIONS", c.KafkaPartitions, 4},
		{"KAFKA_REPLICATION_FACTOR", c.KafkaReplicationFactor, 1},
		{"QUEUE_FAILOVER_ENABLED", c.QueueFailoverEnabled, true},
		{"DIRECT_PATH_ENABLED", c.DirectPathEnabled, true},
		{"QUEUE_FAILOVER_TIMEOUT_SECONDS", c.QueueFailoverTimeout, 30 * time.Second},
		{"QUEUE_FAILOVER_MAX_RETRIES", c.QueueFailoverMaxRetries, 5},
		{"QUEUE_FAILOVER_BASE_DELAY_MS", c.QueueFailoverBaseDelay, 100 * time.Millisecond},
		{"QUEUE_FAILOVER_MAX_DELAY_MS", c.QueueFailoverMaxDelay, 5000 * time.Millisecond},
		{"QUEUE_FAILOVER_CHUNK_BATCH_SIZE", c.QueueFailoverChunkBatchSize, 5},
		{"QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS", c.QueueFailoverChunkBatchTimeout, 100 * time.Millisecond},
		{"QUEUE_RECLAIM_IDLE_SECONDS", c.QueueReclaimIdle, 15 * time.Second},
		{"DEAD_LETTER_MAX_LEN", c.DeadLetterMaxLen, 10000},
		{"DEAD_LETTER_TTL_HOURS", c.DeadLetterTTL, 168 * time.Hour},
		{"DEAD_LETTER_KEEP_PAYLOAD", c.DeadLetterKeepPayload, false},
		{"QUEUE_OVERFLOW_THRESHOLD", c.QueueOverflowThreshold, 10000},
		{"QUEUE_OVERFLOW_HYSTERESIS", c.QueueOverflowHysteresis, 500},
		{"QUEUE_SHED_LOW_FRACTION", c.QueueShedLowFraction, 0.5},
		{"QUEUE_SHED_NORMAL_FRACTION", c.QueueShedNormalFraction, 0.8},
		{"PRIORITY_MAX", c.PriorityMax, "normal"},
		{"METRICS_AUTH", c.MetricsAuth, "none"},
		{"PRIORITY_AGING_SECONDS", c.PriorityAging, 30 * time.Second},
		{"DEGRADE_MAX_TOKENS", c.DegradeMaxTokens, 1024},
		{"DEGRADE_MIN_REQUESTS", c.DegradeMinRequests, 20},
		{"DEGRADE_PROBE_EVERY", c.DegradeProbeEvery, 10},
		{"QUEUE_RETRY_AFTER_SECONDS", c.QueueRetryAfter, 60 * time.Second},
		{"QUEUE_DEPTH_CACHE_TTL_MS", c.QueueDepthCacheTTL, 1000 * time.Millisecond},
		{"QUEUE_PREFIX", c.QueuePrefix, "queue:"},
		{"WORKER_CONCURRENCY", c.WorkerConcurrency, 16},
		{"WORKER_HEARTBEAT_SECONDS", c.WorkerHeartbeat, 5 * time.Second},
		{"EMBEDDED_WORKERS", c.EmbeddedWorkers, (*bool)(nil)},
		{"CONNECTION_POOL_SIZE", c.ConnectionPoolSize, 2}, // embedded mode
		{"CONNECTION_POOL_PER_USER", c.ConnectionPoolPerUser, 5},
		{"POOL_BACKEND", c.PoolBackend, "local"}, // embedded mode
		{"POOL_LEASE_TTL_SECONDS", c.PoolLeaseTTL, 30 * time.Second},
		{"POOL_LOCAL_FALLBACK_SIZE", c.PoolLocalFallbackSize, 10},
		{"POOL_IDLE_HOLD_MS", c.PoolIdleHold, 200 * time.Millisecond},
		{"ADAPTIVE_CONCURRENCY", c.AdaptiveConcurrency, false},
		{"ADAPTIVE_CONCURRENCY_FLOOR", c.AdaptiveConcurrencyFloor, 1},
		{"ADAPTIVE_FIRST_TOKEN_TARGET_MS", c.AdaptiveFirstTokenTarget, time.Duration(0)},
		{"ADAPTIVE_INTERVAL_MS", c.AdaptiveInterval, 1000 * time.Millisecond},
		{"REDIS_POOL_SIZE", c.RedisPoolSize, 0},
		{"REDIS_MIN_IDLE_CONNS", c.RedisMinIdleConns, 0},
		{"REDIS_DIAL_TIMEOUT_MS", c.RedisDialTimeout, 1000 * time.Millisecond},
		{"REDIS_TIMEOUT_MS", c.RedisTimeout, 3000 * time.Millisecond},
		{"REDIS_POOL_TIMEOUT_MS", c.RedisPoolTimeout, 1000 * time.Millisecond},
		{"REDIS_DOWN_AFTER_MS", c.RedisDownAfter, 3000 * time.Millisecond},
		{"HEARTBEAT_INTERVAL_SECONDS", c.HeartbeatInterval, 15 * time.Second},
		{"MAX_BODY_BYTES", c.MaxBodyBytes, int64(16777216)},
		{"BODY_BYTES_IN_FLIGHT", c.BodyBytesInFlight, int64(268435456)},
		{"MAX_MESSAGES", c.MaxMessages, 1000},
		{"MAX_TOKENS_LIMIT", c.MaxTokensLimit, 1048576},
		{"MAX_CHOICES", c.MaxChoices, 8},
		{"NONTEXT_PART_TOKENS", c.NonTextPartTokens, 1000},
		{"SHUTDOWN_GRACE_SECONDS", c.ShutdownGrace, 25 * time.Second},
		{"STREAM_LOG_TTL_SECONDS", c.StreamLogTTL, 300 * time.Second},
		{"STREAM_LOG_FLUSH_MS", c.StreamLogFlush, 50 * time.Millisecond},
		{"STREAM_RESUME_WINDOW_SECONDS", c.StreamResumeWindow, 10 * time.Second},
		{"RATE_LIMIT_RPS", c.RateLimitRPS, 0.0},
		{"RATE_LIMIT_BURST", c.RateLimitBurst, 0},
		{"API_KEYS", c.APIKeys, []string(nil)},
		{"TRUST_USER_ID_HEADER", c.TrustUserIDHeader, true},
		{"TRUSTED_PROXIES", c.TrustedProxies, []string(nil)},
		{"QUEUE_MAX_PER_IDENTITY", c.QueueMaxPerIdentity, 100},
		{"QUEUE_MAX_BYTES", c.QueueMaxBytes, int64(268435456)},
		{"BODY_READ_TIMEOUT_SECONDS", c.BodyReadTimeout, 10 * time.Second},
		{"MAX_CONNECTIONS", c.MaxConnections, 20000},
		{"HTTP_IDLE_TIMEOUT_SECONDS", c.HTTPIdleTimeout, 120 * time.Second},
		{"LLM_MODELS", c.LLMModels, []string(nil)},
		{"LLM_MODEL", c.LLMModel, ""},
		{"MODELS_CACHE_SECONDS", c.ModelsCacheTTL, models.DefaultTTL},
		{"BREAKER_FAILURES", c.BreakerFailures, 5},
		{"BREAKER_WINDOW_SECONDS", c.BreakerWindow, 60 * time.Second},
		{"BREAKER_OPEN_SECONDS", c.BreakerOpen, 30 * time.Second},
		{"BREAKER_HALF_OPEN_REQUESTS", c.BreakerHalfOpenRequests, 3},
		{"LLM_PROVIDER", c.LLMProvider, "sim"},
		{"LLM_BASE_URL", c.LLMBaseURL, ""},
		{"LLM_API_KEY", c.LLMAPIKey, ""},
		{"LLM_FIRST_TOKEN_TIMEOUT_SECONDS", c.LLMFirstTokenTimeout, 60 * time.Second},
		{"LLM_IDLE_TIMEOUT_SECONDS", c.LLMIdleTimeout, 30 * time.Second},
		{"LLM_TIMEOUT_SECONDS", c.LLMTimeout, time.Duration(0)},
		{"LLM_RETRY_AFTER_MAX_SECONDS", c.LLMRetryAfterMax, 30 * time.Second},
		{"LLM_ROUTING", c.LLMRouting, "least-loaded"},
		{"LLM_AFFINITY_BALANCE", c.LLMAffinityBalance, 1.5},
		{"LLM_UPSTREAM_MAX_CONCURRENCY", c.LLMUpstreamMaxConcurrency, 0},
		{"LLM_UPSTREAM_MAX_FAILS", c.LLMUpstreamMaxFails, 3},
		{"LLM_UPSTREAM_COOLDOWN_SECONDS", c.LLMUpstreamCooldown, 30 * time.Second},
		{"LLM_UPSTREAM_PROBE_SECONDS", c.LLMUpstreamProbe, time.Duration(0)},
		{"SIM_FIRST_TOKEN_MS", c.SimFirstToken, 150 * time.Millisecond},
		{"SIM_TOKEN_MS", c.SimTokenInterval, 20 * time.Millisecond},
		{"SIM_TOKENS", c.SimTokens, 48},
		{"SIM_SEED", c.SimSeed, int64(1)},
		{"SIM_FAIL_RATE", c.SimFailRate, 0.0},
		{"SIM_FAIL_MIDSTREAM_RATE", c.SimFailMidstreamRate, 0.0},
		{"CORS_ALLOWED_ORIGINS", c.CORSAllowedOrigins, []string{"*"}}, // embedded mode
		{"CHAT_PAGE_ENABLED", c.ChatPageEnabled, true},
		{"LOG_LEVEL", c.LogLevel, "info"},
	}
	var covered []string
	for _, r := range rows {
		covered = append(covered, r.name)
		if !reflect.DeepEqual(r.got, r.want) {
			t.Errorf("%s default = %#v, want %#v", r.name, r.got, r.want)
		}
	}
	slices.Sort(covered)
	if !slices.Equal(covered, allVars()) {
		t.Errorf("default rows cover %v,\nsettings are %v", covered, allVars())
	}
	if !c.Embedded() || !c.WorkersInProcess() || c.RedisMode() != RedisModeEmbedded {
		t.Errorf("no REDIS_URL: Embedded() = %v, WorkersInProcess() = %v, want true, true", c.Embedded(), c.WorkersInProcess())
	}
	if c.SlogLevel() != slog.LevelInfo {
		t.Errorf("SlogLevel() = %v, want info", c.SlogLevel())
	}
}

func TestEnvOverridesEverySetting(t *testing.T) {
	t.Parallel()
	environ := map[string]string{
		"HTTP_ADDR":                             "127.0.0.1:9000",
		"CONSUMER_HTTP_ADDR":                    ":9191",
		"REDIS_URL":                             "rediss://user:pw@redis.example:6380/2",
		"QUEUE_TYPE":                            "kafka",
		"KAFKA_BROKERS":                         "k1:9092, k2:9092",
		"KAFKA_PARTITIONS":                      "8",
		"KAFKA_REPLICATION_FACTOR":              "3",
		"QUEUE_FAILOVER_ENABLED":                "false",
		"DIRECT_PATH_ENABLED":                   "false",
		"QUEUE_FAILOVER_TIMEOUT_SECONDS":        "31",
		"QUEUE_FAILOVER_MAX_RETRIES":            "0",
		"QUEUE_FAILOVER_BASE_DELAY_MS":          "101",
		"QUEUE_FAILOVER_MAX_DELAY_MS":           "5001",
		"QUEUE_FAILOVER_CHUNK_BATCH_SIZE":       "6",
		"QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS": "102",
		"QUEUE_RECLAIM_IDLE_SECONDS":            "16",
		"DEAD_LETTER_MAX_LEN":                   "10001",
		"DEAD_LETTER_TTL_HOURS":                 "169",
		"DEAD_LETTER_KEEP_PAYLOAD":              "true",
		"QUEUE_OVERFLOW_THRESHOLD":              "10001",
		"QUEUE_OVERFLOW_HYSTERESIS":             "501",
		"QUEUE_SHED_LOW_FRACTION":               "0.4",
		"QUEUE_SHED_NORMAL_FRACTION":            "0.9",
		"PRIORITY_MAX":                          "high",
		"METRICS_AUTH":                          "api-key",
		"PRIORITY_AGING_SECONDS":                "31",
		"DEGRADE_MAX_TOKENS":                    "512",
		"DEGRADE_MIN_REQUESTS":                  "21",
		"DEGRADE_PROBE_EVERY":                   "11",
		"QUEUE_RETRY_AFTER_SECONDS":             "61",
		"QUEUE_DEPTH_CACHE_TTL_MS":              "1001",
		"QUEUE_PREFIX":                          "sw:",
		"WORKER_CONCURRENCY":                    "17",
		"WORKER_HEARTBEAT_SECONDS":              "6",
		"EMBEDDED_WORKERS":                      "true",
		"CONNECTION_POOL_SIZE":                  "101",
		"CONNECTION_POOL_PER_USER":              "7",
		"POOL_BACKEND":                          "local",
		"POOL_LEASE_TTL_SECONDS":                "32",
		"POOL_LOCAL_FALLBACK_SIZE":              "11",
		"POOL_IDLE_HOLD_MS":                     "201",
		"ADAPTIVE_CONCURRENCY":                  "true",
		"ADAPTIVE_CONCURRENCY_FLOOR":            "3",
		"ADAPTIVE_FIRST_TOKEN_TARGET_MS":        "2500",
		"ADAPTIVE_INTERVAL_MS":                  "500",
		"REDIS_POOL_SIZE":                       "65",
		"REDIS_MIN_IDLE_CONNS":                  "9",
		"REDIS_DIAL_TIMEOUT_MS":                 "1001",
		"REDIS_TIMEOUT_MS":                      "3001",
		"REDIS_POOL_TIMEOUT_MS":                 "1002",
		"REDIS_DOWN_AFTER_MS":                   "3002",
		"HEARTBEAT_INTERVAL_SECONDS":            "14",
		"MAX_BODY_BYTES":                        "2048",
		"BODY_BYTES_IN_FLIGHT":                  "8192",
		"MAX_MESSAGES":                          "1001",
		"MAX_TOKENS_LIMIT":                      "32769",
		"MAX_CHOICES":                           "4",
		"NONTEXT_PART_TOKENS":                   "765",
		"SHUTDOWN_GRACE_SECONDS":                "26",
		"STREAM_LOG_TTL_SECONDS":                "301",
		"STREAM_LOG_FLUSH_MS":                   "51",
		"STREAM_RESUME_WINDOW_SECONDS":          "11",
		"RATE_LIMIT_RPS":                        "2.5",
		"RATE_LIMIT_BURST":                      "3",
		"API_KEYS":                              "key-a,key-b",
		"LLM_PROVIDER":                          "openai",
		"LLM_BASE_URL":                          "http://127.0.0.1:8081/v1",
		"LLM_API_KEY":                           "sk-test",
		"LLM_TIMEOUT_SECONDS":                   "121",
		"LLM_FIRST_TOKEN_TIMEOUT_SECONDS":       "61",
		"LLM_IDLE_TIMEOUT_SECONDS":              "31",
		"LLM_RETRY_AFTER_MAX_SECONDS":           "32",
		"LLM_ROUTING":                           "affinity",
		"LLM_UPSTREAM_MAX_CONCURRENCY":          "8",
		"LLM_UPSTREAM_MAX_FAILS":                "4",
		"LLM_UPSTREAM_COOLDOWN_SECONDS":         "31",
		"LLM_AFFINITY_BALANCE":                  "2.5",
		"LLM_UPSTREAM_PROBE_SECONDS":            "5",
		"SIM_FIRST_TOKEN_MS":                    "151",
		"SIM_TOKEN_MS":                          "21",
		"SIM_TOKENS":                            "49",
		"SIM_SEED":                              "-7",
		"SIM_FAIL_RATE":                         "0.25",
		"SIM_FAIL_MIDSTREAM_RATE":               "1",
		"CORS_ALLOWED_ORIGINS":                  "https://chat.example.com, http://localhost:3000",
		"CHAT_PAGE_ENABLED":                     "false",
		"LOG_LEVEL":                             "debug",
		"UNRELATED_VAR":                         "ignored",
		"BREAKER_FAILURES":                      "6",
		"BREAKER_WINDOW_SECONDS":                "61",
		"BREAKER_OPEN_SECONDS":                  "31",
		"BREAKER_HALF_OPEN_REQUESTS":            "4",
		"TRUST_USER_ID_HEADER":                  "false",
		"TRUSTED_PROXIES":                       "10.0.0.0/8, 192.168.0.1",
		"QUEUE_MAX_PER_IDENTITY":                "7",
		"QUEUE_MAX_BYTES":                       "4096",
		"BODY_READ_TIMEOUT_SECONDS":             "3",
		"MAX_CONNECTIONS":                       "500",
		"HTTP_IDLE_TIMEOUT_SECONDS":             "61",
		"LLM_MODELS":                            "gpt-a, gpt-b",
		"LLM_MODEL":                             " gpt-b ",
		"MODELS_CACHE_SECONDS":                  "61",
	}
	// DIRECT_PATH_ENABLED=false and QUEUE_FAILOVER_ENABLED=false together are
	// invalid, so each bool is overridden in its own load below.
	direct := maps.Clone(environ)
	direct["DIRECT_PATH_ENABLED"] = "true"
	c := mustLoad(t, "", direct)
	want := &Config{
		HTTPAddr:                       "127.0.0.1:9000",
		ConsumerHTTPAddr:               ":9191",
		RedisURL:                       "rediss://user:pw@redis.example:6380/2",
		QueueShards:                    1, // its own load below: shards exclude Kafka
		QueueType:                      "kafka",
		KafkaBrokers:                   []string{"k1:9092", "k2:9092"},
		KafkaPartitions:                8,
		KafkaReplicationFactor:         3,
		QueueFailoverEnabled:           false,
		DirectPathEnabled:              true,
		QueueFailoverTimeout:           31 * time.Second,
		QueueFailoverMaxRetries:        0,
		QueueFailoverBaseDelay:         101 * time.Millisecond,
		QueueFailoverMaxDelay:          5001 * time.Millisecond,
		QueueFailoverChunkBatchSize:    6,
		QueueFailoverChunkBatchTimeout: 102 * time.Millisecond,
		QueueReclaimIdle:               16 * time.Second,
		DeadLetterMaxLen:               10001,
		DeadLetterTTL:                  169 * time.Hour,
		DeadLetterKeepPayload:          true,
		QueueOverflowThreshold:         10001,
		QueueOverflowHysteresis:        501,
		QueueShedLowFraction:           0.4,
		QueueShedNormalFraction:        0.9,
		PriorityMax:                    "high",
		MetricsAuth:                    "api-key",
		PriorityAging:                  31 * time.Second,
		DegradeMaxTokens:               512,
		DegradeMinRequests:             21,
		DegradeProbeEvery:              11,
		QueueRetryAfter:                61 * time.Second,
		QueueDepthCacheTTL:             1001 * time.Millisecond,
		QueuePrefix:                    "sw:",
		WorkerConcurrency:              17,
		WorkerHeartbeat:                6 * time.Second,
		EmbeddedWorkers:                ptr(true),
		ConnectionPoolSize:             101,
		ConnectionPoolPerUser:          7,
		PoolBackend:                    "local",
		PoolLeaseTTL:                   32 * time.Second,
		PoolLocalFallbackSize:          11,
		PoolIdleHold:                   201 * time.Millisecond,
		AdaptiveConcurrency:            true,
		AdaptiveConcurrencyFloor:       3,
		AdaptiveFirstTokenTarget:       2500 * time.Millisecond,
		AdaptiveInterval:               500 * time.Millisecond,
		RedisPoolSize:                  65,
		RedisMinIdleConns:              9,
		RedisDialTimeout:               1001 * time.Millisecond,
		RedisTimeout:                   3001 * time.Millisecond,
		RedisPoolTimeout:               1002 * time.Millisecond,
		RedisDownAfter:                 3002 * time.Millisecond,
		HeartbeatInterval:              14 * time.Second,
		MaxBodyBytes:                   2048,
		BodyBytesInFlight:              8192,
		MaxMessages:                    1001,
		MaxTokensLimit:                 32769,
		MaxChoices:                     4,
		NonTextPartTokens:              765,
		ShutdownGrace:                  26 * time.Second,
		StreamLogTTL:                   301 * time.Second,
		StreamLogFlush:                 51 * time.Millisecond,
		StreamResumeWindow:             11 * time.Second,
		RateLimitRPS:                   2.5,
		RateLimitBurst:                 3,
		APIKeys:                        []string{"key-a", "key-b"},
		BreakerFailures:                6,
		BreakerWindow:                  61 * time.Second,
		BreakerOpen:                    31 * time.Second,
		BreakerHalfOpenRequests:        4,
		LLMProvider:                    "openai",
		LLMBaseURL:                     "http://127.0.0.1:8081/v1",
		LLMAPIKey:                      "sk-test",
		LLMTimeout:                     121 * time.Second,
		LLMFirstTokenTimeout:           61 * time.Second,
		LLMIdleTimeout:                 31 * time.Second,
		LLMRetryAfterMax:               32 * time.Second,
		LLMRouting:                     "affinity",
		LLMUpstreamMaxConcurrency:      8,
		LLMUpstreamMaxFails:            4,
		LLMUpstreamCooldown:            31 * time.Second,
		LLMAffinityBalance:             2.5,
		LLMUpstreamProbe:               5 * time.Second,
		Upstreams: []upstream.Spec{{Name: "127.0.0.1:8081", BaseURL: "http://127.0.0.1:8081/v1", APIKey: "sk-test",
			Weight: 1, MaxConcurrency: 8}},
		SimFirstToken:        151 * time.Millisecond,
		SimTokenInterval:     21 * time.Millisecond,
		SimTokens:            49,
		SimSeed:              -7,
		SimFailRate:          0.25,
		SimFailMidstreamRate: 1,
		CORSAllowedOrigins:   []string{"https://chat.example.com", "http://localhost:3000"},
		ChatPageEnabled:      false,
		LogLevel:             "debug",
		TrustUserIDHeader:    false,
		TrustedProxies:       []string{"10.0.0.0/8", "192.168.0.1"},
		QueueMaxPerIdentity:  7,
		QueueMaxBytes:        4096,
		BodyReadTimeout:      3 * time.Second,
		MaxConnections:       500,
		HTTPIdleTimeout:      61 * time.Second,
		LLMModels:            []string{"gpt-a", "gpt-b"},
		LLMModel:             "gpt-b",
		ModelsCacheTTL:       61 * time.Second,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load with every var set:\n got %+v\nwant %+v", c, want)
	}

	queued := maps.Clone(environ)
	queued["QUEUE_FAILOVER_ENABLED"] = "true"
	if c := mustLoad(t, "", queued); c.DirectPathEnabled || !c.QueueFailoverEnabled {
		t.Errorf("DIRECT_PATH_ENABLED=false: DirectPathEnabled = %v, QueueFailoverEnabled = %v", c.DirectPathEnabled, c.QueueFailoverEnabled)
	}

	// Cluster and Sentinel exclude REDIS_URL and each other (and shards
	// exclude Kafka), so their settings are overridden in loads of their own.
	cluster := map[string]string{"REDIS_CLUSTER_ADDRS": "n1:7000, n2:7001", "REDIS_PASSWORD": "pw", "QUEUE_SHARDS": "8"}
	if c := mustLoad(t, "", cluster); !slices.Equal(c.RedisClusterAddrs, []string{"n1:7000", "n2:7001"}) ||
		c.RedisPassword != "pw" || c.QueueShards != 8 || c.RedisMode() != RedisModeCluster || c.Embedded() {
		t.Errorf("cluster settings: addrs %q, password %q, shards %d, mode %s", c.RedisClusterAddrs, c.RedisPassword, c.QueueShards, c.RedisMode())
	}
	sentinel := map[string]string{"REDIS_SENTINEL_ADDRS": "s1:26379,s2:26379", "REDIS_SENTINEL_MASTER": "mymaster", "REDIS_SENTINEL_PASSWORD": "spw"}
	if c := mustLoad(t, "", sentinel); !slices.Equal(c.RedisSentinelAddrs, []string{"s1:26379", "s2:26379"}) ||
		c.RedisSentinelMaster != "mymaster" || c.RedisSentinelPassword != "spw" || c.RedisMode() != RedisModeSentinel || c.Embedded() {
		t.Errorf("sentinel settings: addrs %q, master %q, password %q, mode %s", c.RedisSentinelAddrs, c.RedisSentinelMaster, c.RedisSentinelPassword, c.RedisMode())
	}

	var names []string
	for _, m := range []map[string]string{environ, cluster, sentinel} {
		for k := range m {
			if k != "UNRELATED_VAR" && !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, allVars()) {
		t.Errorf("override env covers %v,\nsettings are %v", names, allVars())
	}
}

func TestEnvEdgeCases(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		environ map[string]string
		check   func(testing.TB, *Config)
	}{
		{
			name:    "empty value counts as unset",
			environ: map[string]string{"HTTP_ADDR": "", "REDIS_URL": "", "WORKER_CONCURRENCY": ""},
			check: func(tb testing.TB, c *Config) {
				if c.HTTPAddr != ":8080" || !c.Embedded() || c.WorkerConcurrency != 16 {
					tb.Errorf("HTTPAddr %q, Embedded %v, WorkerConcurrency %d; want defaults", c.HTTPAddr, c.Embedded(), c.WorkerConcurrency)
				}
			},
		},
		{
			name: "lists are trimmed and empty items dropped",
			environ: map[string]string{
				"REDIS_URL": "redis://r:6379", "QUEUE_TYPE": "kafka",
				"KAFKA_BROKERS": " a:1 , b:2,,", "API_KEYS": "k1, ,k2 ",
			},
			check: func(tb testing.TB, c *Config) {
				if !slices.Equal(c.KafkaBrokers, []string{"a:1", "b:2"}) || !slices.Equal(c.APIKeys, []string{"k1", "k2"}) {
					tb.Errorf("KafkaBrokers %q, APIKeys %q", c.KafkaBrokers, c.APIKeys)
				}
			},
		},
		{
			name:    "list of only separators is empty",
			environ: map[string]string{"API_KEYS": " , "},
			check: func(tb testing.TB, c *Config) {
				if c.APIKeys != nil {
					tb.Errorf("APIKeys = %q, want nil", c.APIKeys)
				}
			},
		},
		{
			name:    "log level in any case",
			environ: map[string]string{"LOG_LEVEL": "WARN"},
			check: func(tb testing.TB, c *Config) {
				if c.SlogLevel() != slog.LevelWarn {
					tb.Errorf("SlogLevel() = %v, want warn", c.SlogLevel())
				}
			},
		},
		{
			name:    "no CORS by default with REDIS_URL",
			environ: map[string]string{"REDIS_URL": "redis://r:6379"},
			check: func(tb testing.TB, c *Config) {
				if c.CORSAllowedOrigins != nil {
					tb.Errorf("CORSAllowedOrigins = %q, want nil", c.CORSAllowedOrigins)
				}
			},
		},
		{
			name:    "CORS origins replace the embedded default",
			environ: map[string]string{"CORS_ALLOWED_ORIGINS": "https://a.example, ,http://b.example:8000"},
			check: func(tb testing.TB, c *Config) {
				if !slices.Equal(c.CORSAllowedOrigins, []string{"https://a.example", "http://b.example:8000"}) {
					tb.Errorf("CORSAllowedOrigins = %q", c.CORSAllowedOrigins)
				}
			},
		},
		{
			// 0 is no grace for the api's drain and the workers' stop
			// alike (worker.Config.StopGrace), not the default.
			name:    "SHUTDOWN_GRACE_SECONDS=0 is no grace",
			environ: map[string]string{"SHUTDOWN_GRACE_SECONDS": "0"},
			check: func(tb testing.TB, c *Config) {
				if c.ShutdownGrace != 0 {
					tb.Errorf("ShutdownGrace = %v, want 0", c.ShutdownGrace)
				}
			},
		},
		{
			name:    "EMBEDDED_WORKERS=false in embedded mode",
			environ: map[string]string{"EMBEDDED_WORKERS": "false"},
			check: func(tb testing.TB, c *Config) {
				if c.EmbeddedWorkers == nil || *c.EmbeddedWorkers || c.WorkersInProcess() {
					tb.Errorf("EmbeddedWorkers %v, WorkersInProcess %v; want explicit false", c.EmbeddedWorkers, c.WorkersInProcess())
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.check(t, mustLoad(t, "", tt.environ))
		})
	}
}

func TestDerivedDefaults(t *testing.T) {
	t.Parallel()
	const redisURL = "redis://localhost:6379/0"
	tests := []struct {
		name        string
		environ     map[string]string
		wantPool    int
		wantBackend string
		wantWorkers bool
	}{
		{"embedded", nil, 2, "local", true},
		{"redis", map[string]string{"REDIS_URL": redisURL}, 100, "redis", false},
		{"redis, zero pool means unset", map[string]string{"REDIS_URL": redisURL, "CONNECTION_POOL_SIZE": "0"}, 100, "redis", false},
		{"embedded, explicit pool kept", map[string]string{"CONNECTION_POOL_SIZE": "7"}, 7, "local", true},
		{"redis, explicit pool kept", map[string]string{"REDIS_URL": redisURL, "CONNECTION_POOL_SIZE": "2"}, 2, "redis", false},
		{"redis, explicit local backend kept", map[string]string{"REDIS_URL": redisURL, "POOL_BACKEND": "local"}, 100, "local", false},
		{"redis, embedded workers on", map[string]string{"REDIS_URL": redisURL, "EMBEDDED_WORKERS": "true"}, 100, "redis", true},
		{"cluster", map[string]string{"REDIS_CLUSTER_ADDRS": "n1:7000"}, 100, "redis", false},
		{"sentinel", map[string]string{"REDIS_SENTINEL_ADDRS": "s:26379", "REDIS_SENTINEL_MASTER": "m"}, 100, "redis", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mustLoad(t, "", tt.environ)
			if c.ConnectionPoolSize != tt.wantPool || c.PoolBackend != tt.wantBackend || c.WorkersInProcess() != tt.wantWorkers {
				t.Errorf("pool %d, backend %q, workers in process %v; want %d, %q, %v",
					c.ConnectionPoolSize, c.PoolBackend, c.WorkersInProcess(), tt.wantPool, tt.wantBackend, tt.wantWorkers)
			}
		})
	}
}

func TestFileAndEnvPrecedence(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		file    string
		environ map[string]string
		check   func(testing.TB, *Config)
	}{
		{
			name:    "file beats default, env beats file",
			file:    "http_addr: \":9000\"\nworker_concurrency: 3\nsim_tokens: 9\n",
			environ: map[string]string{"WORKER_CONCURRENCY": "7"},
			check: func(tb testing.TB, c *Config) {
				if c.HTTPAddr != ":9000" || c.WorkerConcurrency != 7 || c.SimTokens != 9 || c.MaxMessages != 1000 {
					tb.Errorf("HTTPAddr %q WorkerConcurrency %d SimTokens %d MaxMessages %d; want :9000 7 9 1000",
						c.HTTPAddr, c.WorkerConcurrency, c.SimTokens, c.MaxMessages)
				}
			},
		},
		{
			name:    "empty env does not erase the file's value",
			file:    "redis_url: redis://file:6379\nllm_api_key: from-file\n",
			environ: map[string]string{"REDIS_URL": "", "LLM_API_KEY": ""},
			check: func(tb testing.TB, c *Config) {
				if c.RedisURL != "redis://file:6379" || c.LLMAPIKey != "from-file" {
					tb.Errorf("RedisURL %q LLMAPIKey %q; want the file's", c.RedisURL, c.LLMAPIKey)
				}
			},
		},
		{
			name: "redis_url in file drives derived defaults",
			file: "redis_url: redis://file:6379\n",
			check: func(tb testing.TB, c *Config) {
				if c.ConnectionPoolSize != 100 || c.PoolBackend != "redis" {
					tb.Errorf("pool %d backend %q; want 100 redis", c.ConnectionPoolSize, c.PoolBackend)
				}
			},
		},
		{
			name: "flow list",
			file: "redis_url: redis://r:6379\nqueue_type: kafka\nkafka_brokers: [a:1, b:2]\n",
			check: func(tb testing.TB, c *Config) {
				if !slices.Equal(c.KafkaBrokers, []string{"a:1", "b:2"}) {
					tb.Errorf("KafkaBrokers = %q", c.KafkaBrokers)
				}
			},
		},
		{
			name: "block list",
			file: "api_keys:\n  - k1\n  - k2\n",
			check: func(tb testing.TB, c *Config) {
				if !slices.Equal(c.APIKeys, []string{"k1", "k2"}) {
					tb.Errorf("APIKeys = %q", c.APIKeys)
				}
			},
		},
		{
			name: "comma string",
			file: "redis_url: redis://r:6379\nqueue_type: kafka\nkafka_brokers: \"a:1,b:2\"\n",
			check: func(tb testing.TB, c *Config) {
				if !slices.Equal(c.KafkaBrokers, []string{"a:1", "b:2"}) {
					tb.Errorf("KafkaBrokers = %q", c.KafkaBrokers)
				}
			},
		},
		{
			name:    "env list replaces file list",
			file:    "api_keys: [k1, k2]\n",
			environ: map[string]string{"API_KEYS": "k3"},
			check: func(tb testing.TB, c *Config) {
				if !slices.Equal(c.APIKeys, []string{"k3"}) {
					tb.Errorf("APIKeys = %q", c.APIKeys)
				}
			},
		},
		{
			name: "null is unset",
			file: "redis_url: ~\nhttp_addr:\n",
			check: func(tb testing.TB, c *Config) {
				if !c.Embedded() || c.HTTPAddr != ":8080" {
					tb.Errorf("RedisURL %q HTTPAddr %q; want unset, default", c.RedisURL, c.HTTPAddr)
				}
			},
		},
		{
			name: "bools, floats, pointers",
			file: "queue_failover_enabled: false\nrate_limit_rps: 2.5\nrate_limit_burst: 4\nembedded_workers: false\nmax_body_bytes: 4096\n",
			check: func(tb testing.TB, c *Config) {
				if c.QueueFailoverEnabled || c.RateLimitRPS != 2.5 || c.RateLimitBurst != 4 || c.WorkersInProcess() || c.MaxBodyBytes != 4096 {
					tb.Errorf("QueueFailoverEnabled %v RateLimitRPS %v RateLimitBurst %d WorkersInProcess %v MaxBodyBytes %d",
						c.QueueFailoverEnabled, c.RateLimitRPS, c.RateLimitBurst, c.WorkersInProcess(), c.MaxBodyBytes)
				}
			},
		},
		{
			name:    "file with only comments",
			file:    "# nothing here\n",
			environ: map[string]string{"SIM_SEED": "3"},
			check: func(tb testing.TB, c *Config) {
				want := mustLoad(tb, "", map[string]string{"SIM_SEED": "3"})
				if !reflect.DeepEqual(c, want) {
					tb.Errorf("got %+v, want %+v", c, want)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.check(t, mustLoad(t, writeFile(t, tt.file), tt.environ))
		})
	}
}

func TestFileErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"unknown key", "http_addr: \":1\"\nworker_concurency: 3\n", []string{`line 2: unknown key "worker_concurency"`}},
		{"every unknown key", "foo: 1\nbar: 2\n", []string{`unknown key "foo"`, `unknown key "bar"`}},
		{"upper-case key", "HTTP_ADDR: \":1\"\n", []string{`unknown key "HTTP_ADDR"`, `"http_addr"`}},
		{"duplicate key", "sim_tokens: 1\nsim_tokens: 2\n", []string{`line 2: key "sim_tokens" given twice`}},
		{"nested mapping", "http_addr:\n  host: x\n", []string{"http_addr: value must be a plain value or a list"}},
		{"nested list", "api_keys: [[a]]\n", []string{"api_keys: list items must be plain values"}},
		{"comma inside a list item", "api_keys: [\"a,b\"]\n", []string{`api_keys: list item "a,b" contains a comma`}},
		{"top level list", "- http_addr\n", []string{"top level must be a mapping"}},
		{"not yaml", "http_addr: [\n", []string{"settings file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := writeFile(t, tt.file)
			_, err := Load(path, nil)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			for _, w := range append(tt.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}

	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), nil)
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("error = %v, want fs.ErrNotExist", err)
		}
	})
}

func TestParseErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		file     string
		environ  map[string]string
		wantVars []string
		wantMsg  []string
	}{
		{
			name:     "int from env",
			environ:  map[string]string{"HTTP_ADDR": ":9000", "WORKER_CONCURRENCY": "abc"},
			wantVars: []string{"WORKER_CONCURRENCY"},
			wantMsg:  []string{"WORKER_CONCURRENCY (in env) is not a valid int", `"abc"`},
		},
		{
			name:     "int from file",
			file:     "worker_concurrency: abc\n",
			wantVars: []string{"WORKER_CONCURRENCY"},
			wantMsg:  []string{"WORKER_CONCURRENCY (in ", ".yaml) is not a valid int"},
		},
		{
			name:     "env value is the one reported",
			file:     "sim_tokens: 5\n",
			environ:  map[string]string{"SIM_TOKENS": "many"},
			wantVars: []string{"SIM_TOKENS"},
			wantMsg:  []string{"SIM_TOKENS (in env)", `"many"`},
		},
		{
			name: "every bad value at once",
			environ: map[string]string{
				"WORKER_CONCURRENCY": "abc", "QUEUE_FAILOVER_ENABLED": "maybe", "SIM_FAIL_RATE": "half",
				"EMBEDDED_WORKERS": "perhaps", "MAX_BODY_BYTES": "1.5", "SIM_SEED": "x",
			},
			wantVars: []string{"EMBEDDED_WORKERS", "MAX_BODY_BYTES", "QUEUE_FAILOVER_ENABLED", "SIM_FAIL_RATE", "SIM_SEED", "WORKER_CONCURRENCY"},
			wantMsg:  []string{"is not a valid bool", "is not a valid float64", "is not a valid int64"},
		},
		{
			name:     "int out of range",
			environ:  map[string]string{"QUEUE_OVERFLOW_THRESHOLD": "99999999999"},
			wantVars: []string{"QUEUE_OVERFLOW_THRESHOLD"},
			wantMsg:  []string{"QUEUE_OVERFLOW_THRESHOLD (in env) is not a valid int"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := ""
			if tt.file != "" {
				path = writeFile(t, tt.file)
			}
			_, err := Load(path, tt.environ)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			if got := errVars(err); !slices.Equal(got, tt.wantVars) {
				t.Errorf("error names %v, want %v; error: %v", got, tt.wantVars, err)
			}
			for _, w := range append(tt.wantMsg, tt.wantVars...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "HTTP_ADDR") {
				t.Errorf("error %q names HTTP_ADDR, whose value is fine", err)
			}
		})
	}
}

func TestValidateRules(t *testing.T) {
	t.Parallel()
	const redisURL = "redis://localhost:6379/0"
	tests := []struct {
		name     string
		mutate   func(*Config)
		wantVars []string
		wantMsg  string
	}{
		{"http addr empty", func(c *Config) { c.HTTPAddr = "" }, []string{"HTTP_ADDR"}, "HTTP_ADDR must not be empty"},
		{"http addr without colon", func(c *Config) { c.HTTPAddr = "8080" }, []string{"HTTP_ADDR"}, `HTTP_ADDR ("8080") must be host:port`},
		{"consumer addr empty", func(c *Config) { c.ConsumerHTTPAddr = "" }, []string{"CONSUMER_HTTP_ADDR"}, "CONSUMER_HTTP_ADDR must not be empty"},
		{"consumer addr without port", func(c *Config) { c.ConsumerHTTPAddr = "localhost:" }, []string{"CONSUMER_HTTP_ADDR"}, `CONSUMER_HTTP_ADDR ("localhost:") must be host:port`},
		{"redis url scheme", func(c *Config) { c.RedisURL = "http://r:6379" }, []string{"REDIS_URL"}, `REDIS_URL is not a valid redis:// or rediss:// URL: scheme is "http"`},
		{"redis url unix socket", func(c *Config) { c.RedisURL = "unix:///tmp/redis.sock" }, []string{"REDIS_URL"}, `scheme is "unix"`},
		{"redis url bad db", func(c *Config) { c.RedisURL = "redis://r:6379/db" }, []string{"REDIS_URL"}, "REDIS_URL is not a valid redis:// or rediss:// URL: redis: invalid database number"},
		{"redis url unparsable", func(c *Config) { c.RedisURL = "redis://u:s3cret@r:port" }, []string{"REDIS_URL"}, "REDIS_URL is not a valid"},
		{"queue type", func(c *Config) { c.QueueType = "rabbit" }, []string{"QUEUE_TYPE"}, `QUEUE_TYPE ("rabbit") must be redis or kafka`},
		{"kafka with 1s heartbeats", func(c *Config) {
			c.RedisURL = redisURL
			c.QueueType = "kafka"
			c.KafkaBrokers = []string{"k:9092"}
			c.WorkerHeartbeat = time.Second
		}, []string{"WORKER_HEARTBEAT_SECONDS"}, "WORKER_HEARTBEAT_SECONDS (1) must be at least 2 with QUEUE_TYPE=kafka"},
		{"kafka in embedded mode", func(c *Config) { c.QueueType = "kafka"; c.KafkaBrokers = []string{"k:9092"} }, []string{"QUEUE_TYPE"}, "QUEUE_TYPE (kafka) needs REDIS_URL: embedded mode"},
		{"kafka without brokers", func(c *Config) { c.RedisURL = redisURL; c.QueueType = "kafka" }, []string{"KAFKA_BROKERS"}, "KAFKA_BROKERS is required when QUEUE_TYPE=kafka"},
		{"kafka broker without port", func(c *Config) {
			c.RedisURL = redisURL
			c.QueueType = "kafka"
			c.KafkaBrokers = []string{"k:9092", "kafka"}
		}, []string{"KAFKA_BROKERS"}, `KAFKA_BROKERS item "kafka" must be host:port`},
		{"queue prefix empty", func(c *Config) { c.QueuePrefix = "" }, []string{"QUEUE_PREFIX"}, "QUEUE_PREFIX must not be empty"},
		{"queue prefix with space", func(c *Config) { c.QueuePrefix = "my queue:" }, []string{"QUEUE_PREFIX"}, `QUEUE_PREFIX ("my queue:") must not contain spaces`},
		{"queue prefix with tab", func(c *Config) { c.QueuePrefix = "q\t" }, []string{"QUEUE_PREFIX"}, "must not contain spaces"},
		{"direct and failover both off", func(c *Config) { c.DirectPathEnabled = false; c.QueueFailoverEnabled = false }, []string{"DIRECT_PATH_ENABLED"}, "DIRECT_PATH_ENABLED (false) needs QUEUE_FAILOVER_ENABLED=true"},
		{"pool backend unknown", func(c *Config) { c.PoolBackend = "memcached" }, []string{"POOL_BACKEND"}, `POOL_BACKEND ("memcached") must be local or redis`},
		{"pool backend unset", func(c *Config) { c.PoolBackend = "" }, []string{"POOL_BACKEND"}, `POOL_BACKEND ("") must be local or redis`},
		{"redis pool in embedded mode", func(c *Config) { c.PoolBackend = "redis" }, []string{"POOL_BACKEND"}, "POOL_BACKEND (redis) needs REDIS_URL"},
		{"cors origin with path", func(c *Config) { c.CORSAllowedOrigins = []string{"https://a.example/"} }, []string{"CORS_ALLOWED_ORIGINS"}, `CORS_ALLOWED_ORIGINS item "https://a.example/" must be "*" or an origin`},
		{"cors origin without scheme", func(c *Config) { c.CORSAllowedOrigins = []string{"a.example:3000"} }, []string{"CORS_ALLOWED_ORIGINS"}, "scheme or host is missing"},
		{"cors origin with query", func(c *Config) { c.CORSAllowedOrigins = []string{"https://a.example?x=1"} }, []string{"CORS_ALLOWED_ORIGINS"}, "no user, path"},
		{"cors star with others", func(c *Config) { c.CORSAllowedOrigins = []string{"*", "https://a.example"} }, []string{"CORS_ALLOWED_ORIGINS"}, `lists "*" with other origins`},
		{"queue max per identity", func(c *Config) { c.QueueMaxPerIdentity = 0 }, []string{"QUEUE_MAX_PER_IDENTITY"}, "QUEUE_MAX_PER_IDENTITY (0) must be at least 1"},
		{"queue max bytes below a body", func(c *Config) { c.QueueMaxBytes = 1000 }, []string{"QUEUE_MAX_BYTES"}, "QUEUE_MAX_BYTES (1000) must be at least MAX_BODY_BYTES (16777216)"},
		{"body read timeout", func(c *Config) { c.BodyReadTimeout = 0 }, []string{"BODY_READ_TIMEOUT_SECONDS"}, "BODY_READ_TIMEOUT_SECONDS (0) must be at least 1"},
		{"max connections", func(c *Config) { c.MaxConnections = 0 }, []string{"MAX_CONNECTIONS"}, "MAX_CONNECTIONS (0) must be at least 1"},
		{"http idle timeout", func(c *Config) { c.HTTPIdleTimeout = 0 }, []string{"HTTP_IDLE_TIMEOUT_SECONDS"}, "HTTP_IDLE_TIMEOUT_SECONDS (0) must be at least 1"},
		{"api key bad digest", func(c *Config) { c.APIKeys = []string{"ok", "sha256:s3cret"} }, []string{"API_KEYS"}, "API_KEYS has a bad entry"},
		{"trusted proxy not a cidr", func(c *Config) { c.TrustedProxies = []string{"10.0.0.0/8", "proxy.local"} }, []string{"TRUSTED_PROXIES"}, `"proxy.local" is not a CIDR`},
		{"model name too long", func(c *Config) { c.LLMModels = []string{strings.Repeat("m", 257)} }, []string{"LLM_MODELS"}, "LLM_MODELS item of 257 bytes"},
		{"default model too long", func(c *Config) { c.LLMModel = strings.Repeat("m", 257) }, []string{"LLM_MODEL"}, "LLM_MODEL (257 bytes) is longer"},
		{"default model not allowed", func(c *Config) { c.LLMModel, c.LLMModels = "gpt-c", []string{"gpt-a"} }, []string{"LLM_MODEL"}, `LLM_MODEL ("gpt-c") must be one of LLM_MODELS`},
		{"models cache negative", func(c *Config) { c.ModelsCacheTTL = -1 * time.Second }, []string{"MODELS_CACHE_SECONDS"}, "MODELS_CACHE_SECONDS (-1) must be at least 0"},
		{"pool size", func(c *Config) { c.ConnectionPoolSize = 0 }, []string{"CONNECTION_POOL_SIZE"}, "CONNECTION_POOL_SIZE (0) must be at least 1"},
		{"pool per user", func(c *Config) { c.ConnectionPoolPerUser = 0 }, []string{"CONNECTION_POOL_PER_USER"}, "CONNECTION_POOL_PER_USER (0) must be at least 1"},
		{"lease ttl", func(c *Config) { c.PoolLeaseTTL = time.Second }, []string{"POOL_LEASE_TTL_SECONDS"}, "POOL_LEASE_TTL_SECONDS (1) must be at least 2"},
		{"fallback size", func(c *Config) { c.PoolLocalFallbackSize = 0 }, []string{"POOL_LOCAL_FALLBACK_SIZE"}, "POOL_LOCAL_FALLBACK_SIZE (0) must be at least 1"},
		{"idle hold", func(c *Config) { c.PoolIdleHold = -1 * time.Millisecond }, []string{"POOL_IDLE_HOLD_MS"}, "POOL_IDLE_HOLD_MS (-1) must be at least 0"},
		{"kafka partitions", func(c *Config) { c.KafkaPartitions = 0 }, []string{"KAFKA_PARTITIONS"}, "KAFKA_PARTITIONS (0) must be at least 1"},
		{"kafka replication", func(c *Config) { c.KafkaReplicationFactor = 0 }, []string{"KAFKA_REPLICATION_FACTOR"}, "KAFKA_REPLICATION_FACTOR (0) must be at least 1"},
		{"worker concurrency", func(c *Config) { c.WorkerConcurrency = 0 }, []string{"WORKER_CONCURRENCY"}, "WORKER_CONCURRENCY (0) must be at least 1"},
		{"worker heartbeat", func(c *Config) { c.WorkerHeartbeat = 0 }, []string{"WORKER_HEARTBEAT_SECONDS"}, "WORKER_HEARTBEAT_SECONDS (0) must be at least 1"},
		{"reclaim equals heartbeat", func(c *Config) { c.QueueReclaimIdle = 5 * time.Second }, []string{"QUEUE_RECLAIM_IDLE_SECONDS"}, "QUEUE_RECLAIM_IDLE_SECONDS (5) must be greater than WORKER_HEARTBEAT_SECONDS (5)"},
		{"reclaim below heartbeat", func(c *Config) { c.WorkerHeartbeat = 20 * time.Second }, []string{"QUEUE_RECLAIM_IDLE_SECONDS"}, "QUEUE_RECLAIM_IDLE_SECONDS (15) must be greater than WORKER_HEARTBEAT_SECONDS (20)"},
		{"failover timeout", func(c *Config) { c.QueueFailoverTimeout = 0 }, []string{"QUEUE_FAILOVER_TIMEOUT_SECONDS"}, "QUEUE_FAILOVER_TIMEOUT_SECONDS (0) must be at least 1"},
		{"max retries", func(c *Config) { c.QueueFailoverMaxRetries = -1 }, []string{"QUEUE_FAILOVER_MAX_RETRIES"}, "QUEUE_FAILOVER_MAX_RETRIES (-1) must be at least 0"},
		{"base delay", func(c *Config) { c.QueueFailoverBaseDelay = 0 }, []string{"QUEUE_FAILOVER_BASE_DELAY_MS"}, "QUEUE_FAILOVER_BASE_DELAY_MS (0) must be at least 1"},
		{"max delay below base", func(c *Config) { c.QueueFailoverMaxDelay = 99 * time.Millisecond }, []string{"QUEUE_FAILOVER_MAX_DELAY_MS"}, "QUEUE_FAILOVER_MAX_DELAY_MS (99) must be at least QUEUE_FAILOVER_BASE_DELAY_MS (100)"},
		{"batch size", func(c *Config) { c.QueueFailoverChunkBatchSize = 0 }, []string{"QUEUE_FAILOVER_CHUNK_BATCH_SIZE"}, "QUEUE_FAILOVER_CHUNK_BATCH_SIZE (0) must be at least 1"},
		{"batch timeout", func(c *Config) { c.QueueFailoverChunkBatchTimeout = 0 }, []string{"QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS"}, "QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS (0) must be at least 1"},
		{"overflow threshold", func(c *Config) { c.QueueOverflowThreshold = 0; c.QueueOverflowHysteresis = 0 }, []string{"QUEUE_OVERFLOW_HYSTERESIS", "QUEUE_OVERFLOW_THRESHOLD"}, "QUEUE_OVERFLOW_THRESHOLD (0) must be at least 1"},
		{"hysteresis negative", func(c *Config) { c.QueueOverflowHysteresis = -1 }, []string{"QUEUE_OVERFLOW_HYSTERESIS"}, "QUEUE_OVERFLOW_HYSTERESIS (-1) must be at least 0"},
		{"hysteresis not below threshold", func(c *Config) { c.QueueOverflowHysteresis = 10000 }, []string{"QUEUE_OVERFLOW_HYSTERESIS"}, "QUEUE_OVERFLOW_HYSTERESIS (10000) must be less than QUEUE_OVERFLOW_THRESHOLD (10000)"},
		{"shed low zero", func(c *Config) { c.QueueShedLowFraction = 0 }, []string{"QUEUE_SHED_LOW_FRACTION"}, "QUEUE_SHED_LOW_FRACTION (0) must be above 0 and at most 1"},
		{"shed low above one", func(c *Config) { c.QueueShedLowFraction = 1.5 }, []string{"QUEUE_SHED_LOW_FRACTION"}, "QUEUE_SHED_LOW_FRACTION (1.5) must be above 0 and at most 1"},
		{"shed normal below low", func(c *Config) { c.QueueShedNormalFraction = 0.3 }, []string{"QUEUE_SHED_NORMAL_FRACTION"}, "QUEUE_SHED_NORMAL_FRACTION (0.3) must be at least QUEUE_SHED_LOW_FRACTION (0.5) and at most 1"},
		{"priority max unknown", func(c *Config) { c.PriorityMax = "urgent" }, []string{"PRIORITY_MAX"}, `PRIORITY_MAX ("urgent") must be high, normal or low`},
		{"metrics auth unknown", func(c *Config) { c.MetricsAuth = "token" }, []string{"METRICS_AUTH"}, `METRICS_AUTH ("token") must be none or api-key`},
		{"metrics auth without keys", func(c *Config) { c.MetricsAuth = "api-key"; c.APIKeys = nil }, []string{"METRICS_AUTH"}, "METRICS_AUTH (api-key) needs API_KEYS"},
		{"priority aging", func(c *Config) { c.PriorityAging = 0 }, []string{"PRIORITY_AGING_SECONDS"}, "PRIORITY_AGING_SECONDS (0) must be at least 1"},
		{"degrade max tokens", func(c *Config) { c.DegradeMaxTokens = 0 }, []string{"DEGRADE_MAX_TOKENS"}, "DEGRADE_MAX_TOKENS (0) must be at least 1"},
		{"degrade min requests", func(c *Config) { c.DegradeMinRequests = 0 }, []string{"DEGRADE_MIN_REQUESTS"}, "DEGRADE_MIN_REQUESTS (0) must be at least 1"},
		{"degrade probe every", func(c *Config) { c.DegradeProbeEvery = -1 }, []string{"DEGRADE_PROBE_EVERY"}, "DEGRADE_PROBE_EVERY (-1) must be at least 1"},
		{"adaptive floor zero", func(c *Config) { c.AdaptiveConcurrencyFloor = 0 }, []string{"ADAPTIVE_CONCURRENCY_FLOOR"}, "ADAPTIVE_CONCURRENCY_FLOOR (0) must be at least 1"},
		{"adaptive floor above pool", func(c *Config) { c.AdaptiveConcurrencyFloor = 3 }, []string{"ADAPTIVE_CONCURRENCY_FLOOR"}, "ADAPTIVE_CONCURRENCY_FLOOR (3) must be at most CONNECTION_POOL_SIZE (2)"},
		{"adaptive target negative", func(c *Config) { c.AdaptiveFirstTokenTarget = -1 * time.Millisecond }, []string{"ADAPTIVE_FIRST_TOKEN_TARGET_MS"}, "ADAPTIVE_FIRST_TOKEN_TARGET_MS (-1) must be at least 0"},
		{"adaptive interval", func(c *Config) { c.AdaptiveInterval = 99 * time.Millisecond }, []string{"ADAPTIVE_INTERVAL_MS"}, "ADAPTIVE_INTERVAL_MS (99) must be at least 100"},
		{"retry after", func(c *Config) { c.QueueRetryAfter = 0 }, []string{"QUEUE_RETRY_AFTER_SECONDS"}, "QUEUE_RETRY_AFTER_SECONDS (0) must be at least 1"},
		{"depth cache ttl", func(c *Config) { c.QueueDepthCacheTTL = 9 * time.Millisecond }, []string{"QUEUE_DEPTH_CACHE_TTL_MS"}, "QUEUE_DEPTH_CACHE_TTL_MS (9) must be at least 10"},
		{"sse heartbeat", func(c *Config) { c.HeartbeatInterval = 0 }, []string{"HEARTBEAT_INTERVAL_SECONDS"}, "HEARTBEAT_INTERVAL_SECONDS (0) must be at least 1"},
		{"max body", func(c *Config) { c.MaxBodyBytes = 1023 }, []string{"MAX_BODY_BYTES"}, "MAX_BODY_BYTES (1023) must be at least 1024"},
		{"max messages", func(c *Config) { c.MaxMessages = 0 }, []string{"MAX_MESSAGES"}, "MAX_MESSAGES (0) must be at least 1"},
		{"max tokens", func(c *Config) { c.MaxTokensLimit = 0 }, []string{"MAX_TOKENS_LIMIT"}, "MAX_TOKENS_LIMIT (0) must be at least 1"},
		{"max choices", func(c *Config) { c.MaxChoices = 0 }, []string{"MAX_CHOICES"}, "MAX_CHOICES (0) must be at least 1"},
		{"bodies in flight below a body", func(c *Config) { c.BodyBytesInFlight = 1 << 20 }, []string{"BODY_BYTES_IN_FLIGHT"}, "BODY_BYTES_IN_FLIGHT (1048576) must be at least MAX_BODY_BYTES (16777216): one body must fit"},
		{"bodies in flight over 64 GiB", func(c *Config) { c.BodyBytesInFlight = 64<<30 + 1 }, []string{"BODY_BYTES_IN_FLIGHT"}, "BODY_BYTES_IN_FLIGHT (68719476737) must be at most 68719476736 (64 GiB)"},
		{"max body over a job", func(c *Config) { c.MaxBodyBytes = 64 << 20; c.QueueMaxBytes = 1 << 30 }, []string{"MAX_BODY_BYTES"}, "a queued job carries the body whole"},
		{"shutdown grace", func(c *Config) { c.ShutdownGrace = -1 * time.Second }, []string{"SHUTDOWN_GRACE_SECONDS"}, "SHUTDOWN_GRACE_SECONDS (-1) must be at least 0"},
		{"resume window", func(c *Config) { c.StreamResumeWindow = -1 * time.Second }, []string{"STREAM_RESUME_WINDOW_SECONDS"}, "STREAM_RESUME_WINDOW_SECONDS (-1) must be at least 0"},
		{"log flush zero", func(c *Config) { c.StreamLogFlush = 0 }, []string{"STREAM_LOG_FLUSH_MS"}, "STREAM_LOG_FLUSH_MS (0) must be at least 1"},
		{"log flush above a second", func(c *Config) { c.StreamLogFlush = 1001 * time.Millisecond }, []string{"STREAM_LOG_FLUSH_MS"}, "STREAM_LOG_FLUSH_MS (1001) must be at most 1000"},
		{"log ttl below window", func(c *Config) { c.StreamLogTTL = 10 * time.Second }, []string{"STREAM_LOG_TTL_SECONDS"}, "STREAM_LOG_TTL_SECONDS (10) must exceed STREAM_RESUME_WINDOW_SECONDS (10): a resume needs the log"},
		{"rps negative", func(c *Config) { c.RateLimitRPS = -1 }, []string{"RATE_LIMIT_RPS"}, "RATE_LIMIT_RPS (-1) must be 0 (off) or a positive number"},
		{"rps NaN", func(c *Config) { c.RateLimitRPS = math.NaN() }, []string{"RATE_LIMIT_RPS"}, "RATE_LIMIT_RPS (NaN)"},
		{"rps infinite", func(c *Config) { c.RateLimitRPS = math.Inf(1); c.RateLimitBurst = 1 }, []string{"RATE_LIMIT_RPS"}, "RATE_LIMIT_RPS (+Inf)"},
		{"burst negative", func(c *Config) { c.RateLimitBurst = -1 }, []string{"RATE_LIMIT_BURST"}, "RATE_LIMIT_BURST (-1) must be at least 0"},
		{"burst zero with rps", func(c *Config) { c.RateLimitRPS = 5 }, []string{"RATE_LIMIT_BURST"}, "RATE_LIMIT_BURST (0) must be at least 1 when RATE_LIMIT_RPS is set (5)"},
		{"provider unknown", func(c *Config) { c.LLMProvider = "anthropic" }, []string{"LLM_PROVIDER"}, `LLM_PROVIDER ("anthropic") must be sim or openai`},
		{"openai without base url", func(c *Config) { c.LLMProvider = "openai" }, []string{"LLM_BASE_URL"}, "LLM_BASE_URL is required when LLM_PROVIDER=openai"},
		{"base url scheme", func(c *Config) { c.LLMProvider = "openai"; c.LLMBaseURL = "ftp://h/v1" }, []string{"LLM_BASE_URL"}, `LLM_BASE_URL must be an http:// or https:// URL (or a comma list of them) with a host: scheme is "ftp"`},
		{"base url without host", func(c *Config) { c.LLMProvider = "openai"; c.LLMBaseURL = "http:///v1" }, []string{"LLM_BASE_URL"}, "host is missing"},
		{"base url without scheme", func(c *Config) { c.LLMProvider = "openai"; c.LLMBaseURL = "localhost:8081/v1" }, []string{"LLM_BASE_URL"}, "LLM_BASE_URL must be an http:// or https:// URL"},
		{"base url checked for sim too", func(c *Config) { c.LLMBaseURL = "::" }, []string{"LLM_BASE_URL"}, "LLM_BASE_URL must be an http:// or https:// URL"},
		{"llm timeout below first token", func(c *Config) { c.LLMTimeout = 59 * time.Second }, []string{"LLM_TIMEOUT_SECONDS"},
			"LLM_TIMEOUT_SECONDS (59) must be 0 (off) or at least LLM_FIRST_TOKEN_TIMEOUT_SECONDS (60)"},
		{"llm timeout negative", func(c *Config) { c.LLMTimeout = -1 * time.Second }, []string{"LLM_TIMEOUT_SECONDS"}, "LLM_TIMEOUT_SECONDS (-1) must be 0 (off)"},
		{"first token timeout", func(c *Config) { c.LLMFirstTokenTimeout = 0 }, []string{"LLM_FIRST_TOKEN_TIMEOUT_SECONDS"},
			"LLM_FIRST_TOKEN_TIMEOUT_SECONDS (0) must be at least 1"},
		{"idle timeout", func(c *Config) { c.LLMIdleTimeout = 0 }, []string{"LLM_IDLE_TIMEOUT_SECONDS"}, "LLM_IDLE_TIMEOUT_SECONDS (0) must be at least 1"},
		{"retry after max", func(c *Config) { c.LLMRetryAfterMax = 0 }, []string{"LLM_RETRY_AFTER_MAX_SECONDS"},
			"LLM_RETRY_AFTER_MAX_SECONDS (0) must be at least 1"},
		{"sim first token", func(c *Config) { c.SimFirstToken = -1 * time.Millisecond }, []string{"SIM_FIRST_TOKEN_MS"}, "SIM_FIRST_TOKEN_MS (-1) must be at least 0"},
		{"sim token ms", func(c *Config) { c.SimTokenInterval = -1 * time.Millisecond }, []string{"SIM_TOKEN_MS"}, "SIM_TOKEN_MS (-1) must be at least 0"},
		{"sim tokens", func(c *Config) { c.SimTokens = 0 }, []string{"SIM_TOKENS"}, "SIM_TOKENS (0) must be at least 1"},
		{"fail rate above 1", func(c *Config) { c.SimFailRate = 1.5 }, []string{"SIM_FAIL_RATE"}, "SIM_FAIL_RATE (1.5) must be between 0 and 1"},
		{"fail rate negative", func(c *Config) { c.SimFailRate = -0.1 }, []string{"SIM_FAIL_RATE"}, "SIM_FAIL_RATE (-0.1) must be between 0 and 1"},
		{"fail rate NaN", func(c *Config) { c.SimFailRate = math.NaN() }, []string{"SIM_FAIL_RATE"}, "SIM_FAIL_RATE (NaN) must be between 0 and 1"},
		{"midstream rate", func(c *Config) { c.SimFailMidstreamRate = 2 }, []string{"SIM_FAIL_MIDSTREAM_RATE"}, "SIM_FAIL_MIDSTREAM_RATE (2) must be between 0 and 1"},
		{"log level", func(c *Config) { c.LogLevel = "verbose" }, []string{"LOG_LEVEL"}, `LOG_LEVEL ("verbose") must be debug, info, warn or error`},
		{"log level empty", func(c *Config) { c.LogLevel = "" }, []string{"LOG_LEVEL"}, `LOG_LEVEL ("") must be`},
		{"url and cluster", func(c *Config) { c.RedisURL = redisURL; c.RedisClusterAddrs = []string{"n:7000"} }, []string{"REDIS_CLUSTER_ADDRS"},
			"REDIS_CLUSTER_ADDRS cannot be combined with REDIS_URL: set exactly one of REDIS_URL (one Redis), REDIS_CLUSTER_ADDRS (Redis Cluster) or REDIS_SENTINEL_ADDRS (Sentinel), or none for embedded mode"},
		{"url and sentinel", func(c *Config) {
			c.RedisURL = redisURL
			c.RedisSentinelAddrs, c.RedisSentinelMaster = []string{"s:26379"}, "m"
		}, []string{"REDIS_SENTINEL_ADDRS"}, "REDIS_SENTINEL_ADDRS cannot be combined with REDIS_URL: set exactly one"},
		{"cluster and sentinel", func(c *Config) {
			c.RedisClusterAddrs = []string{"n:7000"}
			c.RedisSentinelAddrs, c.RedisSentinelMaster = []string{"s:26379"}, "m"
		}, []string{"REDIS_SENTINEL_ADDRS"}, "REDIS_SENTINEL_ADDRS cannot be combined with REDIS_CLUSTER_ADDRS: set exactly one"},
		{"all three modes: one message", func(c *Config) {
			c.RedisURL, c.RedisClusterAddrs = redisURL, []string{"n:7000"}
			c.RedisSentinelAddrs, c.RedisSentinelMaster = []string{"s:26379"}, "m"
		}, []string{"REDIS_SENTINEL_ADDRS"}, "REDIS_SENTINEL_ADDRS cannot be combined with REDIS_URL and REDIS_CLUSTER_ADDRS"},
		{"sentinel without master", func(c *Config) { c.RedisSentinelAddrs = []string{"s:26379"} }, []string{"REDIS_SENTINEL_MASTER"},
			"REDIS_SENTINEL_MASTER is required with REDIS_SENTINEL_ADDRS"},
		{"master without sentinels", func(c *Config) { c.RedisURL = redisURL; c.RedisSentinelMaster = "m" }, []string{"REDIS_SENTINEL_MASTER"},
			"REDIS_SENTINEL_MASTER is set without REDIS_SENTINEL_ADDRS"},
		{"sentinel password without sentinels", func(c *Config) { c.RedisClusterAddrs = []string{"n:7000"}; c.RedisSentinelPassword = "s3cret" },
			[]string{"REDIS_SENTINEL_PASSWORD"}, "REDIS_SENTINEL_PASSWORD is set without REDIS_SENTINEL_ADDRS"},
		{"password with url", func(c *Config) { c.RedisURL = redisURL; c.RedisPassword = "s3cret" }, []string{"REDIS_PASSWORD"},
			"REDIS_PASSWORD is for REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS only"},
		{"password in embedded mode", func(c *Config) { c.RedisPassword = "s3cret" }, []string{"REDIS_PASSWORD"}, "REDIS_PASSWORD is for"},
		{"cluster addr without port", func(c *Config) { c.RedisClusterAddrs = []string{"n:7000", "n2"} }, []string{"REDIS_CLUSTER_ADDRS"},
			`REDIS_CLUSTER_ADDRS item "n2" must be host:port`},
		{"sentinel addr without host", func(c *Config) { c.RedisSentinelAddrs, c.RedisSentinelMaster = []string{":26379"}, "m" },
			[]string{"REDIS_SENTINEL_ADDRS"}, `REDIS_SENTINEL_ADDRS item ":26379" must be host:port`},
		{"shards zero", func(c *Config) { c.QueueShards = 0 }, []string{"QUEUE_SHARDS"}, "QUEUE_SHARDS (0) must be at least 1"},
		{"shards above 64", func(c *Config) { c.QueueShards = 65 }, []string{"QUEUE_SHARDS"}, "QUEUE_SHARDS (65) must be at most 64"},
		{"shards with kafka", func(c *Config) {
			c.RedisClusterAddrs = []string{"n:7000"}
			c.QueueType, c.KafkaBrokers, c.QueueShards = "kafka", []string{"k:9092"}, 2
		}, []string{"QUEUE_SHARDS"}, "QUEUE_SHARDS (2) applies to QUEUE_TYPE=redis only: Kafka scales by KAFKA_PARTITIONS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mustLoad(t, "", nil)
			tt.mutate(c)
			before := *c
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			if got := errVars(err); !slices.Equal(got, tt.wantVars) {
				t.Errorf("error names %v, want %v; error: %v", got, tt.wantVars, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tt.wantMsg)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error %q leaks the Redis password", err)
			}
			if !reflect.DeepEqual(*c, before) && !hasNaN(c) {
				t.Errorf("Validate changed the config: %+v, was %+v", *c, before)
			}
		})
	}
}

// hasNaN reports whether a float field is NaN, which DeepEqual never
// considers equal to itself.
func hasNaN(c *Config) bool {
	return math.IsNaN(c.RateLimitRPS) || math.IsNaN(c.SimFailRate) || math.IsNaN(c.SimFailMidstreamRate)
}

// Each bound is inclusive where the rule says so: the edge values pass.
func TestValidateAcceptsEdges(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"defaults", func(*Config) {}},
		{"smallest numbers", func(c *Config) {
			c.ConnectionPoolSize, c.ConnectionPoolPerUser, c.PoolLeaseTTL, c.PoolLocalFallbackSize = 1, 1, 2*time.Second, 1
			c.WorkerConcurrency, c.WorkerHeartbeat, c.QueueReclaimIdle = 1, time.Second, 2*time.Second
			c.QueueFailoverTimeout, c.QueueFailoverMaxRetries = time.Second, 0
			c.QueueFailoverBaseDelay, c.QueueFailoverMaxDelay = time.Millisecond, time.Millisecond
			c.QueueFailoverChunkBatchSize, c.QueueFailoverChunkBatchTimeout = 1, time.Millisecond
			c.QueueOverflowThreshold, c.QueueOverflowHysteresis, c.QueueRetryAfter, c.QueueDepthCacheTTL = 1, 0, time.Second, 10*time.Millisecond
			c.HeartbeatInterval, c.MaxBodyBytes, c.MaxMessages, c.MaxTokensLimit, c.ShutdownGrace = time.Second, 1024, 1, 1, 0
			c.LLMTimeout, c.SimFirstToken, c.SimTokenInterval, c.SimTokens = time.Second, 0, 0, 1
			c.LLMFirstTokenTimeout, c.LLMIdleTimeout, c.LLMRetryAfterMax = time.Second, time.Second, time.Second
		}},
		{"rates at 1", func(c *Config) { c.SimFailRate, c.SimFailMidstreamRate = 1, 1 }},
		{"rate limit on", func(c *Config) { c.RateLimitRPS, c.RateLimitBurst = 0.5, 1 }},
		{"hysteresis just below threshold", func(c *Config) { c.QueueOverflowHysteresis = 9999 }},
		{"addresses", func(c *Config) { c.HTTPAddr, c.ConsumerHTTPAddr = "127.0.0.1:0", "[::1]:9090" }},
		{"log levels in any case", func(c *Config) { c.LogLevel = "Error" }},
		{"redis and kafka", func(c *Config) {
			c.RedisURL = "rediss://user:pw@r.example:6380/3"
			c.QueueType, c.KafkaBrokers, c.PoolBackend = "kafka", []string{"k1:9092", "[::1]:9093"}, "redis"
		}},
		{"openai", func(c *Config) { c.LLMProvider, c.LLMBaseURL = "openai", "https://api.example.com/v1" }},
		{"queue only", func(c *Config) { c.DirectPathEnabled = false }},
		{"cluster, 64 shards", func(c *Config) {
			c.RedisClusterAddrs, c.RedisPassword, c.QueueShards, c.PoolBackend = []string{"n1:7000", "[::1]:7001"}, "pw", 64, "redis"
		}},
		{"sentinel with passwords", func(c *Config) {
			c.RedisSentinelAddrs, c.RedisSentinelMaster = []string{"s1:26379", "s2:26379"}, "m"
			c.RedisSentinelPassword, c.RedisPassword, c.PoolBackend = "spw", "pw", "redis"
		}},
		{"kafka on a cluster, one shard", func(c *Config) {
			c.RedisClusterAddrs, c.QueueType, c.KafkaBrokers = []string{"n:7000"}, "kafka", []string{"k:9092"}
		}},
		{"embedded, several shards", func(c *Config) { c.QueueShards = 4 }},
		{"no failover", func(c *Config) { c.QueueFailoverEnabled = false }},
		{"cors origins", func(c *Config) {
			c.CORSAllowedOrigins = []string{"https://chat.example.com", "http://127.0.0.1:5173", "capacitor://localhost"}
		}},
		{"no cors", func(c *Config) { c.CORSAllowedOrigins = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := mustLoad(t, "", nil)
			tt.mutate(c)
			if err := c.Validate(); err != nil {
				t.Errorf("Validate() = %v, want nil", err)
			}
		})
	}
}

func TestLoadReportsEveryBadValue(t *testing.T) {
	t.Parallel()
	environ := map[string]string{
		"WORKER_CONCURRENCY":         "0",
		"QUEUE_TYPE":                 "rabbit",
		"LOG_LEVEL":                  "loud",
		"SIM_FAIL_RATE":              "2",
		"QUEUE_RECLAIM_IDLE_SECONDS": "5",
		"QUEUE_PREFIX":               "a b",
		"POOL_BACKEND":               "redis",
		"HTTP_ADDR":                  "8080",
	}
	_, err := Load("", environ)
	if err == nil {
		t.Fatal("Load succeeded, want an error")
	}
	want := []string{"HTTP_ADDR", "LOG_LEVEL", "POOL_BACKEND", "QUEUE_PREFIX", "QUEUE_RECLAIM_IDLE_SECONDS", "QUEUE_TYPE", "SIM_FAIL_RATE", "WORKER_CONCURRENCY"}
	if got := errVars(err); !slices.Equal(got, want) {
		t.Errorf("error names %v, want %v", got, want)
	}
	for _, name := range want {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
	if !strings.Contains(err.Error(), "QUEUE_RECLAIM_IDLE_SECONDS (5) must be greater than WORKER_HEARTBEAT_SECONDS (5)") {
		t.Errorf("error %q lacks the reclaim message", err)
	}
}

func TestExampleFileMatchesDefaults(t *testing.T) {
	t.Parallel()
	for _, environ := range []map[string]string{
		nil,
		{"REDIS_URL": "redis://localhost:6379/0"},
		{"REDIS_CLUSTER_ADDRS": "n1:7000,n2:7001"},
		{"REDIS_SENTINEL_ADDRS": "s:26379", "REDIS_SENTINEL_MASTER": "m"},
	} {
		got := mustLoad(t, exampleFile, environ)
		want := mustLoad(t, "", environ)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("env %v: %s loads as\n %+v\nwant defaults\n %+v", environ, exampleFile, got, want)
		}
	}
}

func TestExampleFileDocumentsEverySetting(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(exampleFile)
	if err != nil {
		t.Fatal(err)
	}
	// These have mode-dependent defaults (or nil means "decide by mode"), so
	// setting them in the file would change behaviour.
	commentedOut := []string{"CONNECTION_POOL_SIZE", "CORS_ALLOWED_ORIGINS", "EMBEDDED_WORKERS", "POOL_BACKEND", "REDIS_URL"}

	active := regexp.MustCompile(`^([a-z_]+):`)
	commented := regexp.MustCompile(`^# ([a-z_]+):`)
	commentedKey := func(line string) string {
		if m := commented.FindStringSubmatch(line); m != nil && knownVars[strings.ToUpper(m[1])] {
			return m[1]
		}
		return ""
	}
	var gotActive, gotCommented []string
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		var key string
		if m := active.FindStringSubmatch(line); m != nil {
			key = m[1]
			gotActive = append(gotActive, strings.ToUpper(key))
		} else if key = commentedKey(line); key != "" {
			gotCommented = append(gotCommented, strings.ToUpper(key))
		} else {
			continue
		}
		if i == 0 || !strings.HasPrefix(lines[i-1], "# ") || commentedKey(lines[i-1]) != "" {
			t.Errorf("line %d (%s) has no one-line comment above it", i+1, key)
		}
	}
	slices.Sort(gotActive)
	slices.Sort(gotCommented)
	if !slices.Equal(gotCommented, commentedOut) {
		t.Errorf("commented-out keys %v, want exactly %v", gotCommented, commentedOut)
	}
	wantActive := slices.DeleteFunc(allVars(), func(n string) bool { return slices.Contains(commentedOut, n) })
	if !slices.Equal(gotActive, wantActive) {
		t.Errorf("keys set in %s:\n %v\nwant every setting but the commented-out ones:\n %v", exampleFile, gotActive, wantActive)
	}
}

func TestSlogLevel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		level string
		want  slog.Level
	}{
		{"debug", slog.LevelDebug},
		{"info", slog.LevelInfo},
		{"warn", slog.LevelWarn},
		{"error", slog.LevelError},
		{"DEBUG", slog.LevelDebug},
		{"bogus", slog.LevelInfo},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			t.Parallel()
			c := &Config{LogLevel: tt.level}
			if got := c.SlogLevel(); got != tt.want {
				t.Errorf("SlogLevel() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestDurationUnits: a duration setting is a whole number in the unit its
// name ends in; anything else is refused with the name, the value and the
// rule.
func TestDurationUnits(t *testing.T) {
	t.Parallel()
	c := mustLoad(t, "", map[string]string{
		"QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS": "17",
		"QUEUE_FAILOVER_TIMEOUT_SECONDS":        " 3 ",
		"DEAD_LETTER_TTL_HOURS":                 "2",
	})
	for _, tt := range []struct {
		name      string
		got, want time.Duration
	}{
		{"QUEUE_FAILOVER_CHUNK_BATCH_TIMEOUT_MS", c.QueueFailoverChunkBatchTimeout, 17 * time.Millisecond},
		{"QUEUE_FAILOVER_TIMEOUT_SECONDS", c.QueueFailoverTimeout, 3 * time.Second},
		{"DEAD_LETTER_TTL_HOURS", c.DeadLetterTTL, 2 * time.Hour},
	} {
		if tt.got != tt.want {
			t.Errorf("%s read as %v, want %v", tt.name, tt.got, tt.want)
		}
	}

	// Empty in the file counts as not set, for a duration as for any setting.
	path := writeFile(t, "queue_reclaim_idle_seconds:\npool_idle_hold_ms: \"\"\n")
	if c := mustLoad(t, path, nil); c.QueueReclaimIdle != Defaults().QueueReclaimIdle || c.PoolIdleHold != Defaults().PoolIdleHold {
		t.Errorf("empty duration settings in the file read as %v and %v, want the defaults", c.QueueReclaimIdle, c.PoolIdleHold)
	}

	for _, tt := range []struct {
		name, value, want string
	}{
		{"QUEUE_RECLAIM_IDLE_SECONDS", "1.5", `QUEUE_RECLAIM_IDLE_SECONDS (in env) is not a whole number of seconds: "1.5"`},
		{"POOL_IDLE_HOLD_MS", "200ms", `POOL_IDLE_HOLD_MS (in env) is not a whole number of milliseconds: "200ms"`},
		{"DEAD_LETTER_TTL_HOURS", "99999999999", `DEAD_LETTER_TTL_HOURS (in env) is too large a number of hours: "99999999999"`},
	} {
		_, err := Load("", map[string]string{tt.name: tt.value, "SIM_TOKEN_MS": "x"})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s=%q: error %v, want it to contain %q", tt.name, tt.value, err, tt.want)
		}
		// The other bad value is reported alongside.
		if got := errVars(err); !slices.Equal(got, []string{tt.name, "SIM_TOKEN_MS"}) && !slices.Equal(got, []string{"SIM_TOKEN_MS", tt.name}) {
			t.Errorf("%s=%q: errors name %v, want %s and SIM_TOKEN_MS", tt.name, tt.value, got, tt.name)
		}
	}
}

func TestEnvironMap(t *testing.T) {
	t.Parallel()
	got := environMap([]string{"A=1", "B=x=y", "C=", "D", "=C:=C:\\", "A=2"})
	want := map[string]string{"A": "2", "B": "x=y", "C": "", "D": ""}
	if !maps.Equal(got, want) {
		t.Errorf("environMap = %v, want %v", got, want)
	}
}

// TestFromEnv reads the real process environment, so it cannot run in
// parallel (t.Setenv forbids it); setting a var to "" makes it unset for Load.
func TestFromEnv(t *testing.T) {
	for _, name := range allVars() {
		t.Setenv(name, "")
	}
	t.Setenv("WORKER_CONCURRENCY", "9")
	path := writeFile(t, "worker_concurrency: 3\nsim_tokens: 4\n")
	c, err := FromEnv(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerConcurrency != 9 || c.SimTokens != 4 {
		t.Errorf("WorkerConcurrency %d SimTokens %d; want 9 from env, 4 from file", c.WorkerConcurrency, c.SimTokens)
	}
}

// A bad URL is reported without the password it carries (issue 29): in
// LLM_BASE_URL (either form of error), the settings file's upstreams,
// REDIS_URL and KAFKA_BROKERS.
func TestBadURLErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-pw"
	for _, environ := range []map[string]string{
		{"LLM_PROVIDER": "openai", "LLM_BASE_URL": "ftp://user:" + secret + "@llm.example/v1"},
		{"LLM_PROVIDER": "openai", "LLM_BASE_URL": "http://user:" + secret + "@llm example/v1"},
		{"LLM_PROVIDER": "openai", "LLM_BASE_URL": "http://user:" + secret + "@a/v1,http://user:" + secret + "@a/v1"},
		{"REDIS_URL": "redis://:" + secret + "@redis:port/0"},
		{"REDIS_URL": "redis://:" + secret + "@redis:6379", "QUEUE_TYPE": "kafka", "KAFKA_BROKERS": "kafka:9092,user:" + secret + "@kafka"},
		// A user part alone passes as host:port, yet is refused (Kafka
		// takes no credentials in an address) without being shown.
		{"REDIS_URL": "redis://redis:6379", "QUEUE_TYPE": "kafka", "KAFKA_BROKERS": "kafka:9092," + secret + "@kafka:9092"},
		{"REDIS_URL": "redis://redis:6379", "QUEUE_TYPE": "kafka", "KAFKA_BROKERS": "user:" + secret + "@kafka:9092"},
	} {
		_, err := Load("", environ)
		if err == nil {
			t.Fatalf("%v: Load succeeded, want an error", environ)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%v: error %q shows the password", environ, err)
		}
		if environ["KAFKA_BROKERS"] != "" && !strings.Contains(err.Error(), "KAFKA_BROKERS") {
			t.Errorf("%v: error %q does not name KAFKA_BROKERS", environ, err)
		}
	}
	path := filepath.Join(t.TempDir(), "spillway.yaml")
	yaml := "llm_provider: openai\nupstreams:\n  - name: a\n    base_url: ftp://user:" + secret + "@llm.example/v1\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, nil)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("upstreams base_url: error %v, want one without the password", err)
	}
}
