package stream

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Defaults of zero Config fields.
const (
	// DefaultWriteTimeout cuts a client that does not take one event
	// within it.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultPoolRetryAfter is advised when the pool is full and no queue
	// takes the request, unless a Gate advises otherwise.
	DefaultPoolRetryAfter = time.Second
	// DefaultFrameBuffer is how many frames a producer may be ahead of
	// the client; with the gateway's buffer (gateway.DefaultBuffer) and
	// the subscriber's (pubsub.DefaultBuffer) it is what a queued stream
	// holds for a slow client.
	DefaultFrameBuffer = 64
)

// Config is the handler's part of the configuration. Zero fields marked
// with a default take it; the others are required.
type Config struct {
	// MaxBodyBytes bounds the request body (MAX_BODY_BYTES).
	MaxBodyBytes int64
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
	// APIKeys are the accepted bearer keys, or sha256 hex digests of them;
	// empty means no authentication (API_KEYS).
	APIKeys []string
	// FrameBuffer is how many frames a producer may be ahead of the client.
	// Default 64.
	FrameBuffer int
	// PriorityMax is the highest X-Priority a caller without a key maximum
	// may ask for; a higher ask is lowered to it (PRIORITY_MAX). Default
	// normal: an anonymous caller cannot jump the queue.
	PriorityMax protocol.Priority
	// Retry is the delay before a direct request that failed before its
	// first chunk is handed to the queue, and the Retry-After advised when
	// there is no queue (docs/TIMEOUTS.md). Zero fields take llm's
	// defaults.
	Retry llm.RetryPolicy
}

func (c Config) withDefaults() Config {
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.PoolRetryAfter == 0 {
		c.PoolRetryAfter = DefaultPoolRetryAfter
	}
	if c.FrameBuffer == 0 {
		c.FrameBuffer = DefaultFrameBuffer
	}
	if c.PriorityMax == "" {
		c.PriorityMax = protocol.PriorityNormal
	}
	return c
}

// Validate reports bad values; it does not change c.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.MaxBodyBytes < 1 {
		errs = append(errs, errors.New("stream: MaxBodyBytes must be positive"))
	}
	if c.Limits.MaxMessages < 1 || c.Limits.MaxTokens < 1 {
		errs = append(errs, errors.New("stream: limits must be positive"))
	}
	if c.Heartbeat <= 0 || c.WriteTimeout < 0 || c.PoolRetryAfter < 0 || c.FrameBuffer < 0 {
		errs = append(errs, errors.New("stream: Heartbeat must be positive; WriteTimeout, PoolRetryAfter and FrameBuffer not negative"))
	}
	if _, err := protocol.ParsePriority(string(c.PriorityMax)); err != nil {
		errs = append(errs, fmt.Errorf("stream: PriorityMax: %w", err))
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("stream: %w", err))
	}
	return errors.Join(errs...)
}

// Deps are what a Handler uses; it closes none of them.
type Deps struct {
	// Pool holds the direct path's slots. Required.
	Pool pool.Pool
	// Provider answers on the direct path. Required.
	Provider llm.Provider
	// Spiller is the queued path; nil means none: a full pool answers 503.
	Spiller failover.Spiller
	// Gate admits requests; nil admits all (see Gate).
	Gate Gate
	// Metrics defaults to counting nothing.
	Metrics Metrics
	// Log is required.
	Log *slog.Logger
}

// Handler serves POST /v1/stream (docs/API.md). Its steps, one file each:
// auth.go (who is asking), parse.go (the request), this file (which
// path), direct.go and queued.go (the two producers), write.go (the write
// loop).
type Handler struct {
	cfg      Config
	pool     pool.Pool
	provider llm.Provider
	spill    failover.Spiller
	gate     Gate
	m        Metrics
	log      *slog.Logger
	keys     apiKeys

	drainOnce sync.Once
	draining  chan struct{}
	wg        sync.WaitGroup
}

// New returns a handler.
func New(cfg Config, deps Deps) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if deps.Pool == nil || deps.Provider == nil || deps.Log == nil {
		return nil, errors.New("stream: pool, provider and logger are required")
	}
	if deps.Gate == nil {
		deps.Gate = openGate{retryAfter: cfg.PoolRetryAfter}
	}
	if deps.Metrics == nil {
		deps.Metrics = nopMetrics{}
	}
	return &Handler{cfg: cfg, pool: deps.Pool, provider: deps.Provider, spill: deps.Spiller, gate: deps.Gate,
		m: deps.Metrics, log: deps.Log, keys: newAPIKeys(cfg.APIKeys), draining: make(chan struct{})}, nil
}

// Drain makes every open stream end now with an `error` event of type
// shutting-down. It is called when the shutdown grace period is over.
func (h *Handler) Drain() { h.drainOnce.Do(func() { close(h.draining) }) }

// Wait blocks until every stream the handler started has ended.
func (h *Handler) Wait() { h.wg.Wait() }

// instanceOf is the problem `instance` of a request (docs/API.md).
func instanceOf(requestID string) string { return "urn:spillway:request:" + requestID }

// ServeHTTP parses the request, finds the caller's identity and streams
// the answer on the direct or queued path.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.wg.Add(1)
	defer h.wg.Done()
	start := time.Now()
	requestID := uuid.NewString()
	instance := instanceOf(requestID)
	setRequestID(w.Header(), requestID)

	req, user, prob := h.parseRequest(w, r)
	var prio protocol.Priority
	if prob == nil {
		prio, prob = h.priority(r, user)
	}
	if prob == nil {
		prob = h.gate.Admit(r.Context(), user, prio)
	}
	if prob != nil {
		h.refuse(w, prob, instance, "")
		return
	}

	if h.cfg.DirectPathEnabled && !h.behindBacklog() {
		lease, err := h.pool.TryAcquire(r.Context(), user)
		if err == nil {
			h.direct(w, r, req, requestID, user, prio, lease, start)
			return
		}
		limit := "global"
		if errors.Is(err, pool.ErrUserLimit) {
			limit = "user"
		}
		h.m.PoolRefused(limit)
	}
	// Either limit sends the request to the queue, where a worker waits for
	// a slot that fits both; without a queue it is refused.
	if h.spill == nil {
		h.refuse(w, protocol.PoolExhausted(h.retryAfter()), instance, protocol.PathDirect)
		return
	}
	h.queued(w, r, req, requestID, user, prio, start)
}

// behindBacklog reports whether jobs wait in the queue, so a new request
// must queue behind them (docs/QUEUE.md, invariant 4).
func (h *Handler) behindBacklog() bool {
	return h.spill != nil && h.gate.QueueFirst()
}

// retryAfter is the Retry-After, in whole seconds, for a full pool.
func (h *Handler) retryAfter() int {
	d := h.gate.RetryAfter()
	// Round up: advising a retry before capacity is likely back only
	// brings the client back to another refusal.
	return max(1, int((d+time.Second-1)/time.Second))
}

// refuse answers with p before any stream opened; path is empty when the
// request was refused before a path was chosen.
func (h *Handler) refuse(w http.ResponseWriter, p *protocol.Problem, instance, path string) {
	if path != "" {
		h.m.StreamEnded(path, OutcomeRefused)
	}
	WriteProblem(w, p, instance)
}
