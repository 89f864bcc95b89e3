package stream

// The handler's configuration: its settings, their defaults and their
// validation (docs/OPERATIONS.md, "Settings").

import (
	"errors"
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Defaults of zero Config fields.
const (
	// DefaultWriteTimeout cuts a client that does not take one event
	// within it.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultTakeOverAfter is how long a queued stream waits for a worker
	// before its writer takes the connection over from net/http.
	DefaultTakeOverAfter = time.Second
	// DefaultPoolRetryAfter is advised when the pool is full and no queue
	// takes the request, unless a Gate advises otherwise.
	DefaultPoolRetryAfter = time.Second
	// DefaultBodyReadTimeout bounds reading the request body
	// (BODY_READ_TIMEOUT_SECONDS).
	DefaultBodyReadTimeout = 10 * time.Second
	// DefaultBodyBytesInFlight is the request-body bytes one api reads or
	// holds at once over every request (BODY_BYTES_IN_FLIGHT); the zero
	// Config field means no bound.
	DefaultBodyBytesInFlight = 256 << 20
)

// Defaults of settings the handler takes as given (a zero Config field
// does not take them): internal/config starts from them.
const (
	// DefaultMaxBodyBytes is MAX_BODY_BYTES' default: 16 MiB, because
	// images travel inline.
	DefaultMaxBodyBytes = 16 << 20
	// DefaultHeartbeat is HEARTBEAT_INTERVAL_SECONDS' default.
	DefaultHeartbeat = 15 * time.Second
	// DefaultResumeWindow is STREAM_RESUME_WINDOW_SECONDS' default: long
	// enough for a client's reconnect after a network blip.
	DefaultResumeWindow = 10 * time.Second
)

// Config is the handler's part of the configuration. Zero fields marked
// with a default take it; the others are required.
type Config struct {
	// MaxBodyBytes bounds the request body (MAX_BODY_BYTES).
	MaxBodyBytes int64
	// BodyBytesInFlight bounds the request-body bytes the handler reads
	// or holds at once, over every request (BODY_BYTES_IN_FLIGHT); zero
	// means no bound. When set, at least MaxBodyBytes.
	BodyBytesInFlight int64
	// Limits bound messages and max_tokens (MAX_MESSAGES, MAX_TOKENS_LIMIT).
	Limits protocol.Limits
	// Heartbeat is the `: ping` period while nothing else was sent
	// (HEARTBEAT_INTERVAL_SECONDS).
	Heartbeat time.Duration
	// WriteTimeout cuts a client that does not take one event within it.
	// Default 10s.
	WriteTimeout time.Duration
	// DirectPathEnabled off sends every request to the queue (DIRECT_PATH_ENABLED).
	DirectPathEnabled bool
	// PoolRetryAfter is the Retry-After advised when the pool is full and
	// no queue takes the request, when there is no Gate. Default 1s.
	PoolRetryAfter time.Duration
	// APIKeys are the accepted bearer keys, or `sha256:<hex>` digests of
	// them, each optionally ending in =high|normal|low; empty means no
	// authentication (API_KEYS).
	APIKeys []string
	// IgnoreUserIDHeader makes X-User-ID count for nothing
	// (TRUST_USER_ID_HEADER=false). Zero: the header names the user.
	IgnoreUserIDHeader bool
	// TrustedProxies are CIDRs whose X-Forwarded-For and X-Real-IP are
	// believed (TRUSTED_PROXIES). Empty: the peer is the client.
	TrustedProxies []string
	// Models, when not empty, are the only `model` values accepted
	// (LLM_MODELS); empty passes any through.
	Models []string
	// ServedModels, when not empty, are the models the upstreams serve
	// (several upstreams, each listing its models): a request naming
	// another is refused with a 400 before any call, as a model outside
	// Models is; a request naming none goes to any upstream.
	ServedModels []string
	// ResumeWindow is how long a stream whose client left keeps
	// generating for a resume (STREAM_RESUME_WINDOW_SECONDS); 0 cancels
	// it at once. It needs Deps.LogWriter and LogReader.
	ResumeWindow time.Duration
	// LogTTL is STREAM_LOG_TTL_SECONDS: how long a stop mark outlives the
	// request, like its log.
	LogTTL time.Duration
	// PriorityMax is the highest X-Priority a caller without a key maximum
	// may ask for; a higher ask is lowered to it (PRIORITY_MAX). Default
	// normal: an anonymous caller cannot jump the queue.
	PriorityMax protocol.Priority
	// BodyReadTimeout bounds reading the request body
	// (BODY_READ_TIMEOUT_SECONDS). Default 10s.
	BodyReadTimeout time.Duration
	// Retry is the delay before a direct request that failed before its
	// first chunk is handed to the queue, and the Retry-After advised when
	// there is no queue (docs/TIMEOUTS.md). Zero fields take llm's
	// defaults.
	Retry llm.RetryPolicy
	// TakeOverAfter is how long a queued stream waits for a worker before
	// its writer takes the connection over from net/http (takeover.go);
	// default DefaultTakeOverAfter, negative: at once, before the head.
	TakeOverAfter time.Duration
}

func (c Config) withDefaults() Config {
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.PoolRetryAfter == 0 {
		c.PoolRetryAfter = DefaultPoolRetryAfter
	}
	if c.PriorityMax == "" {
		c.PriorityMax = protocol.PriorityNormal
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if c.TakeOverAfter == 0 {
		c.TakeOverAfter = DefaultTakeOverAfter
	}
	return c
}

// MaxBodyBytesInFlight bounds Config.BodyBytesInFlight: above it the
// bound is no bound but a typo.
const MaxBodyBytesInFlight = 64 << 30

// Validate reports bad values; it does not change c. Heartbeat,
// BodyReadTimeout, ResumeWindow and BodyBytesInFlight out of range are
// *bounds.Errors; BodyReadTimeout is checked as given: New fills the zero
// fields that have a default before it calls Validate.
func (c Config) Validate() error {
	ranges := []error{
		bounds.AtLeast("Heartbeat", c.Heartbeat, 1),
		bounds.AtLeast("BodyReadTimeout", c.BodyReadTimeout, 1),
		bounds.AtLeast("ResumeWindow", c.ResumeWindow, 0),
	}
	if c.BodyBytesInFlight > MaxBodyBytesInFlight {
		ranges = append(ranges, &bounds.Error{Field: "BodyBytesInFlight", Value: c.BodyBytesInFlight,
			Rule: bounds.RuleAtMost + " (64 GiB)", Bounds: []any{int64(MaxBodyBytesInFlight)}})
	}
	var errs []error
	if err := errors.Join(ranges...); err != nil {
		errs = append(errs, fmt.Errorf("stream: %w", err))
	}
	c = c.withDefaults()
	if c.MaxBodyBytes < 1 {
		errs = append(errs, errors.New("stream: MaxBodyBytes must be positive"))
	}
	if c.BodyBytesInFlight < 0 || (c.BodyBytesInFlight > 0 && c.BodyBytesInFlight < c.MaxBodyBytes) {
		errs = append(errs, errors.New("stream: BodyBytesInFlight must be zero (no bound) or at least MaxBodyBytes"))
	}
	if c.Limits.MaxMessages < 1 || c.Limits.MaxTokens < 1 {
		errs = append(errs, errors.New("stream: limits must be positive"))
	}
	if c.LogTTL < 0 {
		errs = append(errs, errors.New("stream: LogTTL must not be negative"))
	}
	if c.WriteTimeout < 0 || c.PoolRetryAfter < 0 {
		errs = append(errs, errors.New("stream: WriteTimeout and PoolRetryAfter must not be negative"))
	}
	if _, err := newResolver(c); err != nil {
		errs = append(errs, fmt.Errorf("stream: identity settings: %w", err))
	}
	if _, err := protocol.ParsePriority(string(c.PriorityMax)); err != nil {
		errs = append(errs, fmt.Errorf("stream: PriorityMax: %w", err))
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("stream: %w", err))
	}
	return errors.Join(errs...)
}
