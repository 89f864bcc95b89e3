package config

import (
	"github.com/spillway-dev/spillway/internal/llm/upstream"

	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admission"
	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/failover/kafka"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/llm/upstream/models"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/redact"
	"github.com/spillway-dev/spillway/internal/redisclient"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/streamlog"
)

// Values of QUEUE_TYPE, POOL_BACKEND, LLM_PROVIDER, CORS_ALLOWED_ORIGINS and
// METRICS_AUTH.
const (
	// MetricsAuthNone serves /metrics to anyone who reaches the port.
	MetricsAuthNone = "none"
	// MetricsAuthAPIKey serves /metrics only with a bearer key of API_KEYS.
	MetricsAuthAPIKey = "api-key"
	// QueueTypeRedis is the QUEUE_TYPE for Redis Streams.
	QueueTypeRedis = "redis"
	// QueueTypeKafka is the QUEUE_TYPE for Kafka.
	QueueTypeKafka = "kafka"
	// PoolBackendLocal is the POOL_BACKEND that counts slots in this process only.
	PoolBackendLocal = "local"
	// PoolBackendRedis is the POOL_BACKEND shared through Redis by every api and consumer.
	PoolBackendRedis = "redis"
	// ProviderSim is the LLM_PROVIDER for the in-process simulator.
	ProviderSim = "sim"
	// ProviderOpenAI is the LLM_PROVIDER for any OpenAI-compatible endpoint at LLM_BASE_URL.
	ProviderOpenAI = "openai"
	// CORSAnyOrigin is the CORS_ALLOWED_ORIGINS item that allows every origin.
	CORSAnyOrigin = "*"
)

// Lower bounds that are not simply "at least 1".
const (
	minMaxBodyBytes        = 1024
	minPoolLeaseTTLSeconds = 2
	// maxModelName is the longest `model` a request may carry
	// (internal/protocol), so a longer LLM_MODELS item could never match.
	maxModelName = 256
)

// Validate reports every bad value at once, joined with errors.Join, each a
// *FieldError naming its env var. It does not change c. It checks the final
// config, so the mode-dependent defaults Load fills in must be present.
func (c *Config) Validate() error {
	var v validator

	v.listenAddr("HTTP_ADDR", c.HTTPAddr)
	v.listenAddr("CONSUMER_HTTP_ADDR", c.ConsumerHTTPAddr)
	if c.RedisURL != "" {
		if err := checkRedisURL(c.RedisURL); err != nil {
			// The URL itself is not echoed: it may carry a password.
			v.fail("REDIS_URL", "is not a valid redis:// or rediss:// URL: %v", err)
		}
	}
	v.redisModes(c)

	switch c.QueueType {
	case QueueTypeRedis:
	case QueueTypeKafka:
		if c.Embedded() {
			v.fail("QUEUE_TYPE", "(kafka) needs REDIS_URL: embedded mode (no REDIS_URL) supports only QUEUE_TYPE=redis, and results and the pool go through Redis")
		}
		if len(c.KafkaBrokers) == 0 {
			v.fail("KAFKA_BROKERS", "is required when QUEUE_TYPE=kafka")
		}
		// A Kafka takeover waits for the group session (6s) before the
		// claim TTL; the api gives up after 6 heartbeats + the reclaim time
		// of silence, so one heartbeat of 1s would lose every takeover.
		if c.WorkerHeartbeat == time.Second {
			v.fail("WORKER_HEARTBEAT_SECONDS", "(1) must be at least 2 with QUEUE_TYPE=kafka: a takeover waits for the 6s group session")
		}
	default:
		v.fail("QUEUE_TYPE", "(%q) must be redis or kafka", c.QueueType)
	}
	for _, b := range c.KafkaBrokers {
		// A user part (user@host:port) passes SplitHostPort, yet Kafka
		// takes no credentials in an address: refused before any dial
		// error or log line could quote it.
		if host, port, err := net.SplitHostPort(b); err != nil || host == "" || !validPort(port) || strings.Contains(host, "@") {
			v.fail("KAFKA_BROKERS", "item %q must be host:port, without credentials", redact.URL(b))
		}
	}
	if c.QueuePrefix == "" {
		v.fail("QUEUE_PREFIX", "must not be empty")
	} else if strings.ContainsFunc(c.QueuePrefix, unicode.IsSpace) {
		v.fail("QUEUE_PREFIX", "(%q) must not contain spaces", c.QueuePrefix)
	}
	if !c.DirectPathEnabled && !c.QueueFailoverEnabled {
		v.fail("DIRECT_PATH_ENABLED", "(false) needs QUEUE_FAILOVER_ENABLED=true: with both off no request could be served")
	}

	switch c.PoolBackend {
	case PoolBackendLocal:
	case PoolBackendRedis:
		if c.Embedded() {
			v.fail("POOL_BACKEND", "(redis) needs REDIS_URL")
		}
	default:
		v.fail("POOL_BACKEND", "(%q) must be local or redis", c.PoolBackend)
	}
	// The pool takes leases as short as it can renew (tests use them); a
	// process renewing every POOL_LEASE_TTL_SECONDS/3 needs whole seconds.
	v.durationAtLeast("POOL_LEASE_TTL_SECONDS", c.PoolLeaseTTL, minPoolLeaseTTLSeconds)
	if c.AdaptiveConcurrencyFloor >= 1 && c.ConnectionPoolSize >= 1 && c.AdaptiveConcurrencyFloor > c.ConnectionPoolSize {
		v.fail("ADAPTIVE_CONCURRENCY_FLOOR", "(%d) must be at most CONNECTION_POOL_SIZE (%d)", c.AdaptiveConcurrencyFloor, c.ConnectionPoolSize)
	}
	if c.QueueShards > 1 && c.QueueShards <= redisstream.MaxShards && c.QueueType == QueueTypeKafka {
		v.fail("QUEUE_SHARDS", "(%d) applies to QUEUE_TYPE=redis only: Kafka scales by KAFKA_PARTITIONS", c.QueueShards)
	}

	// A live worker refreshes its claim every heartbeat; if the idle limit
	// were not longer, live workers' jobs would be taken over.
	if c.QueueReclaimIdle <= c.WorkerHeartbeat {
		v.fail("QUEUE_RECLAIM_IDLE_SECONDS", "(%s) must be greater than WORKER_HEARTBEAT_SECONDS (%s)",
			inUnit("QUEUE_RECLAIM_IDLE_SECONDS", c.QueueReclaimIdle), inUnit("WORKER_HEARTBEAT_SECONDS", c.WorkerHeartbeat))
	}
	v.durationAtLeast("QUEUE_FAILOVER_BASE_DELAY_MS", c.QueueFailoverBaseDelay, 1)
	if c.QueueFailoverMaxDelay < c.QueueFailoverBaseDelay {
		v.fail("QUEUE_FAILOVER_MAX_DELAY_MS", "(%s) must be at least QUEUE_FAILOVER_BASE_DELAY_MS (%s)",
			inUnit("QUEUE_FAILOVER_MAX_DELAY_MS", c.QueueFailoverMaxDelay), inUnit("QUEUE_FAILOVER_BASE_DELAY_MS", c.QueueFailoverBaseDelay))
	}
	if c.QueueOverflowHysteresis >= 0 && c.QueueOverflowHysteresis >= c.QueueOverflowThreshold {
		v.fail("QUEUE_OVERFLOW_HYSTERESIS", "(%d) must be less than QUEUE_OVERFLOW_THRESHOLD (%d)",
			c.QueueOverflowHysteresis, c.QueueOverflowThreshold)
	}
	if c.QueueShedLowFraction > 0 && c.QueueShedLowFraction <= 1 &&
		!(c.QueueShedNormalFraction >= c.QueueShedLowFraction && c.QueueShedNormalFraction <= 1) {
		v.fail("QUEUE_SHED_NORMAL_FRACTION", "(%g) must be at least QUEUE_SHED_LOW_FRACTION (%g) and at most 1",
			c.QueueShedNormalFraction, c.QueueShedLowFraction)
	}
	if _, err := protocol.ParsePriority(c.PriorityMax); err != nil {
		v.fail("PRIORITY_MAX", "(%q) must be high, normal or low", c.PriorityMax)
	}

	// The handler takes any positive bound (tests use tiny ones); below
	// 1 KiB a deployment would refuse every real request.
	atLeast(&v, "MAX_BODY_BYTES", c.MaxBodyBytes, minMaxBodyBytes)
	// A queued job carries the body whole.
	if c.MaxBodyBytes > protocol.MaxJobBytes-(1<<20) {
		v.fail("MAX_BODY_BYTES", "(%d) must be at most %d: a queued job carries the body whole", c.MaxBodyBytes, protocol.MaxJobBytes-(1<<20))
	}
	// One body must fit, or every request of MAX_BODY_BYTES is refused.
	if c.BodyBytesInFlight < c.MaxBodyBytes {
		v.fail("BODY_BYTES_IN_FLIGHT", "(%d) must be at least MAX_BODY_BYTES (%d): one body must fit", c.BodyBytesInFlight, c.MaxBodyBytes)
	}
	v.durationAtLeast("SHUTDOWN_GRACE_SECONDS", c.ShutdownGrace, 0)
	if c.StreamLogFlush == 0 { // streamlog takes 0 for its default
		v.fail("STREAM_LOG_FLUSH_MS", "(0) must be at least 1")
	}
	if c.StreamLogTTL >= time.Second && c.StreamLogTTL <= c.StreamResumeWindow {
		v.fail("STREAM_LOG_TTL_SECONDS", "(%s) must exceed STREAM_RESUME_WINDOW_SECONDS (%s): a resume needs the log",
			inUnit("STREAM_LOG_TTL_SECONDS", c.StreamLogTTL), inUnit("STREAM_RESUME_WINDOW_SECONDS", c.StreamResumeWindow))
	}
	v.atLeast("MAX_CONNECTIONS", c.MaxConnections, 1)
	v.durationAtLeast("HTTP_IDLE_TIMEOUT_SECONDS", c.HTTPIdleTimeout, 1)
	// A backlog bound below one body would refuse every queued request.
	if c.QueueMaxBytes < c.MaxBodyBytes {
		v.fail("QUEUE_MAX_BYTES", "(%d) must be at least MAX_BODY_BYTES (%d)", c.QueueMaxBytes, c.MaxBodyBytes)
	}
	// The entries may be secrets: the errors name them by position only.
	switch c.MetricsAuth {
	case MetricsAuthNone:
	case MetricsAuthAPIKey:
		if len(c.APIKeys) == 0 {
			v.fail("METRICS_AUTH", "(api-key) needs API_KEYS: the key a scraper sends is one of them")
		}
	default:
		v.fail("METRICS_AUTH", "(%q) must be none or api-key", c.MetricsAuth)
	}
	if _, err := identity.ParseKeys(c.APIKeys); err != nil {
		v.fail("API_KEYS", "has a bad entry (keys, or sha256:<64 hex digits>, optionally ending in =high, =normal or =low): %v", err)
	}
	if _, err := identity.ParseProxies(c.TrustedProxies); err != nil {
		v.fail("TRUSTED_PROXIES", "must be a comma list of CIDRs or addresses: %v", err)
	}
	for _, m := range c.LLMModels {
		if len(m) > maxModelName {
			v.fail("LLM_MODELS", "item of %d bytes is longer than a model name may be (%d)", len(m), maxModelName)
		}
	}
	if len(c.LLMModel) > maxModelName {
		v.fail("LLM_MODEL", "(%d bytes) is longer than a model name may be (%d)", len(c.LLMModel), maxModelName)
	}
	if c.LLMModel != "" && len(c.LLMModels) > 0 && !slices.Contains(c.LLMModels, c.LLMModel) {
		v.fail("LLM_MODEL", "(%q) must be one of LLM_MODELS, or requests that name no model would be sent one they may not ask for", c.LLMModel)
	}

	if c.RateLimitBurst == 0 && c.RateLimitRPS > 0 {
		v.fail("RATE_LIMIT_BURST", "(%d) must be at least 1 when RATE_LIMIT_RPS is set (%g)", c.RateLimitBurst, c.RateLimitRPS)
	}

	v.atLeast("BREAKER_FAILURES", c.BreakerFailures, 1)
	v.durationAtLeast("BREAKER_WINDOW_SECONDS", c.BreakerWindow, 1)
	v.durationAtLeast("BREAKER_OPEN_SECONDS", c.BreakerOpen, 1)
	v.atLeast("BREAKER_HALF_OPEN_REQUESTS", c.BreakerHalfOpenRequests, 1)

	switch c.LLMProvider {
	case ProviderSim:
	case ProviderOpenAI:
		if c.LLMBaseURL == "" && len(c.YAMLUpstreams) == 0 {
			v.fail("LLM_BASE_URL", "is required when LLM_PROVIDER=openai (or an upstreams: list in the settings file)")
		}
	default:
		v.fail("LLM_PROVIDER", "(%q) must be sim or openai", c.LLMProvider)
	}
	if c.LLMBaseURL != "" {
		// A comma list means several upstreams (docs/UPSTREAMS.md).
		for _, u := range strings.Split(c.LLMBaseURL, ",") {
			if err := checkHTTPURL(strings.TrimSpace(u)); err != nil {
				v.fail("LLM_BASE_URL", "must be an http:// or https:// URL (or a comma list of them) with a host: %v", err)
			}
		}
	}
	if c.LLMBaseURL != "" && len(c.YAMLUpstreams) > 0 {
		v.fail("LLM_BASE_URL", "and the settings file's upstreams: list are both given; give one")
	}
	switch c.LLMRouting {
	case upstream.RoutingLeastLoaded, upstream.RoutingWeighted, upstream.RoutingAffinity, upstream.RoutingLatency:
	default:
		v.fail("LLM_ROUTING", "(%q) must be least-loaded, weighted, affinity or latency", c.LLMRouting)
	}
	v.atLeast("LLM_UPSTREAM_MAX_CONCURRENCY", c.LLMUpstreamMaxConcurrency, 0)
	// A cap shorter than the first-token wait would make that wait a lie.
	if c.LLMTimeout != 0 && c.LLMTimeout < c.LLMFirstTokenTimeout {
		v.fail("LLM_TIMEOUT_SECONDS", "(%s) must be 0 (off) or at least LLM_FIRST_TOKEN_TIMEOUT_SECONDS (%s)",
			inUnit("LLM_TIMEOUT_SECONDS", c.LLMTimeout), inUnit("LLM_FIRST_TOKEN_TIMEOUT_SECONDS", c.LLMFirstTokenTimeout))
	}
	v.durationAtLeast("LLM_RETRY_AFTER_MAX_SECONDS", c.LLMRetryAfterMax, 1)

	for _, o := range c.CORSAllowedOrigins {
		if o == CORSAnyOrigin {
			if len(c.CORSAllowedOrigins) > 1 {
				v.fail("CORS_ALLOWED_ORIGINS", "lists %q with other origins: \"*\" already allows every origin", CORSAnyOrigin)
			}
			continue
		}
		if err := checkOrigin(o); err != nil {
			v.fail("CORS_ALLOWED_ORIGINS", "item %q must be \"*\" or an origin like https://chat.example.com: %v", o, err)
		}
	}

	if _, ok := logLevels[strings.ToLower(c.LogLevel)]; !ok {
		v.fail("LOG_LEVEL", "(%q) must be debug, info, warn or error", c.LogLevel)
	}

	v.componentRanges(c)
	return errors.Join(v.errs...)
}

// components are the component Configs whose Validate holds the range of
// a setting, by package and type name; a Config field tagged
// `bounds:"redispool.Config.PerUser"` is that field of that component.
var components = map[string]interface{ Validate() error }{
	"redisclient.Options":       redisclient.Options{},
	"redispool.Config":          redispool.Config{},
	"adaptive.Params":           adaptive.Params{},
	"adaptive.Config":           adaptive.Config{},
	"redisstream.Config":        redisstream.Config{},
	"worker.Config":             worker.Config{},
	"kafka.Config":              kafka.Config{},
	"admission.OverflowConfig":  admission.OverflowConfig{},
	"admission.DegradeConfig":   admission.DegradeConfig{},
	"admission.QuotaConfig":     admission.QuotaConfig{},
	"admission.RateLimitConfig": admission.RateLimitConfig{},
	"stream.Config":             stream.Config{},
	"protocol.Limits":           protocol.Limits{},
	"streamlog.Config":          streamlog.Config{},
	"llm.SimConfig":             llm.SimConfig{},
	"llm.OpenAIConfig":          llm.OpenAIConfig{},
	"upstream.Config":           upstream.Config{},
	"upstream.HealthConfig":     upstream.HealthConfig{},
	"models.Config":             models.Config{},
}

// boundFields maps each component to its fields that a setting fills,
// each to the index of the setting's Config field.
var boundFields = func() map[string]map[string]int {
	m := make(map[string]map[string]int)
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("bounds")
		if tag == "" {
			continue
		}
		dot := strings.LastIndexByte(tag, '.')
		comp, field := tag[:max(dot, 0)], tag[dot+1:]
		cv, ok := components[comp]
		if !ok {
			panic("config: " + f.Name + ": bounds tag names no known component: " + tag)
		}
		cf, ok := reflect.TypeOf(cv).FieldByName(field)
		// Every value must reach the component as it is: the same kind,
		// or an int into an int64.
		if !ok || f.Type.Kind() != cf.Type.Kind() && (f.Type.Kind() != reflect.Int || cf.Type.Kind() != reflect.Int64) {
			panic("config: " + f.Name + ": bounds tag names no field of its kind: " + tag)
		}
		if m[comp] == nil {
			m[comp] = make(map[string]int)
		}
		m[comp][field] = i
	}
	return m
}()

// componentRanges checks the settings whose range their component holds:
// it fills each component's Config with them, runs its Validate and
// reports each *bounds.Error as a FieldError naming the setting, with the
// value and the bounds written as in env. The component's other rules
// need what only the wiring gives (a prefix, a client); New checks those.
func (v *validator) componentRanges(c *Config) {
	rv := reflect.ValueOf(c).Elem()
	for _, comp := range slices.Sorted(maps.Keys(boundFields)) {
		fields := boundFields[comp]
		cv := reflect.New(reflect.TypeOf(components[comp])).Elem()
		for field, i := range fields {
			f := cv.FieldByName(field)
			f.Set(rv.Field(i).Convert(f.Type()))
		}
		err := cv.Interface().(interface{ Validate() error }).Validate()
		for _, e := range bounds.Errors(err) {
			i, ok := fields[e.Field]
			if !ok {
				continue // a field no setting fills
			}
			name := envVars[reflect.TypeFor[Config]().Field(i).Name]
			args := make([]any, len(e.Bounds))
			for j, b := range e.Bounds {
				args[j] = inSetting(name, b, e.Rule == bounds.RuleAtLeast)
			}
			v.fail(name, "(%s) %s", inSetting(name, e.Value, false), fmt.Sprintf(e.Rule, args...))
		}
	}
}

// inSetting writes x, the value or a bound of a setting's field, as it
// would be written in env: a duration in the unit of name (a minimum
// rounded up to a whole unit, as env counts whole units), a float as %g.
func inSetting(name string, x any, minimum bool) string {
	switch x := x.(type) {
	case time.Duration:
		if unit, _, _ := durationUnit(name); minimum && x%unit != 0 {
			x = (x/unit + 1) * unit
		}
		return inUnit(name, x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return fmt.Sprint(x)
}

// redisModes checks that at most one Redis mode is chosen, and that each
// mode's settings are complete and used only with it.
func (v *validator) redisModes(c *Config) {
	var set []string
	for _, m := range []struct {
		name string
		on   bool
	}{
		{"REDIS_URL", c.RedisURL != ""},
		{"REDIS_CLUSTER_ADDRS", len(c.RedisClusterAddrs) > 0},
		{"REDIS_SENTINEL_ADDRS", len(c.RedisSentinelAddrs) > 0},
	} {
		if m.on {
			set = append(set, m.name)
		}
	}
	if len(set) > 1 {
		v.fail(set[len(set)-1], "cannot be combined with %s: set exactly one of REDIS_URL (one Redis), REDIS_CLUSTER_ADDRS (Redis Cluster) or REDIS_SENTINEL_ADDRS (Sentinel), or none for embedded mode",
			strings.Join(set[:len(set)-1], " and "))
	}
	for _, l := range []struct {
		name  string
		addrs []string
	}{{"REDIS_CLUSTER_ADDRS", c.RedisClusterAddrs}, {"REDIS_SENTINEL_ADDRS", c.RedisSentinelAddrs}} {
		for _, a := range l.addrs {
			if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
				v.fail(l.name, "item %q must be host:port", a)
			}
		}
	}
	sentinel := len(c.RedisSentinelAddrs) > 0
	switch {
	case sentinel && c.RedisSentinelMaster == "":
		v.fail("REDIS_SENTINEL_MASTER", "is required with REDIS_SENTINEL_ADDRS: it names the primary the Sentinels monitor")
	case !sentinel && c.RedisSentinelMaster != "":
		v.fail("REDIS_SENTINEL_MASTER", "is set without REDIS_SENTINEL_ADDRS: Sentinel mode needs both")
	}
	if !sentinel && c.RedisSentinelPassword != "" {
		v.fail("REDIS_SENTINEL_PASSWORD", "is set without REDIS_SENTINEL_ADDRS")
	}
	if c.RedisPassword != "" && len(c.RedisClusterAddrs) == 0 && !sentinel {
		v.fail("REDIS_PASSWORD", "is for REDIS_CLUSTER_ADDRS or REDIS_SENTINEL_ADDRS only: with REDIS_URL put the password in the URL")
	}
}

// validator collects FieldErrors.
type validator struct {
	errs []error
}

func (v *validator) fail(name, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Var: name, Err: fmt.Errorf(format, args...)})
}

// atLeast reports whether got >= minimum, recording a failure if not.
func (v *validator) atLeast(name string, got, minimum int) bool {
	return atLeast(v, name, got, minimum)
}

func atLeast[T int | int64](v *validator, name string, got, minimum T) bool {
	if got >= minimum {
		return true
	}
	v.fail(name, "(%d) must be at least %d", got, minimum)
	return false
}

// durationAtLeast reports whether got is at least minimum counted in the
// unit of name (_MS, _SECONDS, _HOURS), recording a failure if not.
func (v *validator) durationAtLeast(name string, got time.Duration, minimum int64) bool {
	unit, _, _ := durationUnit(name)
	if got >= time.Duration(minimum)*unit {
		return true
	}
	v.fail(name, "(%s) must be at least %d", inUnit(name, got), minimum)
	return false
}

// inUnit writes d as a count of the unit of the setting name, as it would
// be written in env; a remainder shows as a fraction.
func inUnit(name string, d time.Duration) string {
	unit, _, _ := durationUnit(name)
	if d%unit == 0 {
		return strconv.FormatInt(int64(d/unit), 10)
	}
	return strconv.FormatFloat(float64(d)/float64(unit), 'g', -1, 64)
}

func (v *validator) listenAddr(name, addr string) {
	if addr == "" {
		v.fail(name, "must not be empty")
		return
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		v.fail(name, "(%q) must be host:port or :port, e.g. \":8080\"", addr)
	}
}

// validPort reports whether port is a TCP port number, 1 to 65535.
func validPort(port string) bool {
	n, err := strconv.ParseUint(port, 10, 16)
	return err == nil && n > 0
}

func checkRedisURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return urlCause(err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return fmt.Errorf("scheme is %q", u.Scheme)
	}
	if _, err := redis.ParseURL(raw); err != nil {
		return urlCause(err)
	}
	return nil
}

func checkHTTPURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return urlCause(err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme is %q", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("host is missing")
	}
	return nil
}

// checkOrigin accepts what a browser sends in Origin: scheme://host[:port],
// nothing after it.
func checkOrigin(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return urlCause(err)
	}
	switch {
	case u.Scheme == "" || u.Host == "":
		return errors.New("scheme or host is missing")
	case u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(raw, "?") || strings.HasSuffix(raw, "#"):
		return errors.New("an origin has no user, path (not even \"/\"), query or fragment")
	}
	return nil
}

// urlCause drops the URL that *url.Error repeats, since it may hold a secret.
func urlCause(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}
