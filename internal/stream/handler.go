package stream

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// Config is the handler's part of the configuration.
type Config struct {
	// MaxBodyBytes bounds the request body (MAX_BODY_BYTES, default 1 MiB).
	MaxBodyBytes int64
	// Limits bound messages and max_tokens (MAX_MESSAGES, MAX_TOKENS_LIMIT).
	Limits protocol.Limits
	// Heartbeat is the `: ping` period while nothing else was sent
	// (HEARTBEAT_INTERVAL_SECONDS, default 15s).
	Heartbeat time.Duration
	// WriteTimeout cuts a client that does not take one event within it.
	// Default 10s.
	WriteTimeout time.Duration
	// DirectPathEnabled off sends every request to the queue (DIRECT_PATH_ENABLED).
	DirectPathEnabled bool
	// PoolRetryAfter is the Retry-After advised when the pool is full and
	// no queue takes the request. Default 1s.
	PoolRetryAfter time.Duration
	// APIKeys are the accepted bearer keys, or sha256 hex digests of them;
	// empty means no authentication (API_KEYS).
	APIKeys []string
	// FrameBuffer is how many frames a producer may be ahead of the client.
	// Default 64.
	FrameBuffer int
}

// Validate reports bad values; it does not change c.
func (c Config) Validate() error {
	var errs []error
	if c.MaxBodyBytes < 1 {
		errs = append(errs, errors.New("stream: MaxBodyBytes must be positive"))
	}
	if c.Limits.MaxMessages < 1 || c.Limits.MaxTokens < 1 {
		errs = append(errs, errors.New("stream: limits must be positive"))
	}
	if c.Heartbeat <= 0 {
		errs = append(errs, errors.New("stream: Heartbeat must be positive"))
	}
	return errors.Join(errs...)
}

// Spiller is the queued path as the handler sees it. Implementations are
// safe for concurrent use.
//
// Spill subscribes to the job's result channel, waits for the subscription
// to be confirmed, then enqueues the job. It returns a Relay only once the
// queue accepted the job; on failure it returns a *protocol.Problem (for
// example queue-overflow or queue-unavailable) to send as the refusal, or
// another error, and nothing stays subscribed.
type Spiller interface {
	Spill(ctx context.Context, job protocol.Job) (Relay, error)
}

// Relay carries one queued request's results back to its handler.
//
// Results delivers decoded results in order. Done is closed when the relay
// ends on its own (subscription lost, worker silent too long, wait
// exceeded); Problem then says what to tell the client. Close ends the
// relay: it unsubscribes and, when the answer was not complete
// (completed false), tells the workers the client is gone so the job is
// skipped or its provider call cancelled. Close is idempotent.
type Relay interface {
	Results() <-chan protocol.Result
	Done() <-chan struct{}
	Problem() *protocol.Problem
	Close(completed bool)
}

// Handler serves POST /v1/stream.
type Handler struct {
	cfg      Config
	pool     pool.Pool
	provider llm.Provider
	spill    Spiller // nil: no queue, a full pool answers 503
	m        *metrics.Metrics
	log      *slog.Logger
	keys     [][sha256.Size]byte
	// queueFirst reports that queued jobs wait for a worker; new requests
	// then join the queue behind them instead of taking a freed slot.
	queueFirst func() bool
	// admitFn refuses a request before any slot or queue work (rate limit,
	// open circuit); nil accepts.
	admitFn func(ctx context.Context, identity string) *protocol.Problem
	// retryAfterFn advises clients refused for a full pool; nil uses
	// PoolRetryAfter. serviceDone observes finished direct streams.
	retryAfterFn func() time.Duration
	serviceDone  func(time.Duration)

	drainOnce sync.Once
	draining  chan struct{}
	wg        sync.WaitGroup
}

// New returns a handler. spill may be nil (no queue failover).
func New(cfg Config, p pool.Pool, provider llm.Provider, spill Spiller, m *metrics.Metrics, log *slog.Logger) (*Handler, error) {
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.PoolRetryAfter == 0 {
		cfg.PoolRetryAfter = time.Second
	}
	if cfg.FrameBuffer == 0 {
		cfg.FrameBuffer = 64
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if p == nil || provider == nil || m == nil || log == nil {
		return nil, errors.New("stream: pool, provider, metrics and logger are required")
	}
	h := &Handler{cfg: cfg, pool: p, provider: provider, spill: spill, m: m, log: log, draining: make(chan struct{})}
	for _, k := range cfg.APIKeys {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		var sum [sha256.Size]byte
		if b, err := hex.DecodeString(k); err == nil && len(b) == sha256.Size {
			copy(sum[:], b)
		} else {
			sum = sha256.Sum256([]byte(k))
		}
		h.keys = append(h.keys, sum)
	}
	return h, nil
}

// Hooks are optional checks and observers the api wires in before
// serving. Nil fields do nothing.
type Hooks struct {
	// Admit runs after validation, before the pool or the queue: a
	// non-nil problem refuses the request (rate limit, open circuit).
	Admit func(ctx context.Context, identity string) *protocol.Problem
	// RetryAfter advises a client refused because the pool is full.
	RetryAfter func() time.Duration
	// ServiceDone observes how long each completed direct stream held its slot.
	ServiceDone func(time.Duration)
	// QueueFirst reports that queued jobs wait for a worker: new requests
	// then queue behind them rather than take a freed slot (no starvation).
	QueueFirst func() bool
}

// SetHooks installs h. Call it before serving.
func (h *Handler) SetHooks(hk Hooks) {
	h.admitFn, h.retryAfterFn, h.serviceDone, h.queueFirst = hk.Admit, hk.RetryAfter, hk.ServiceDone, hk.QueueFirst
}

// Drain makes every open stream end now with an `error` event of type
// shutting-down. It is called when the shutdown grace period is over.
func (h *Handler) Drain() { h.drainOnce.Do(func() { close(h.draining) }) }

// Wait blocks until every stream the handler started has ended.
func (h *Handler) Wait() { h.wg.Wait() }

// ServeHTTP validates the request, finds the caller's identity and streams
// the answer on the direct or queued path.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.wg.Add(1)
	defer h.wg.Done()
	start := time.Now()
	requestID := uuid.NewString()
	instance := "urn:spillway:request:" + requestID
	setRequestID(w.Header(), requestID)

	req, user, prob := h.admit(w, r)
	if prob == nil && h.admitFn != nil {
		prob = h.admitFn(r.Context(), user)
	}
	if prob != nil {
		h.refuse(w, prob, instance, "")
		return
	}

	if h.cfg.DirectPathEnabled && !h.behindBacklog() {
		lease, err := h.pool.TryAcquire(r.Context(), user)
		if err == nil {
			h.direct(w, r, req, requestID, lease, start)
			return
		}
		limit := "global"
		if errors.Is(err, pool.ErrUserLimit) {
			limit = "user"
		}
		h.m.PoolRefusals.WithLabelValues(limit).Inc()
	}
	// Either limit sends the request to the queue, where a worker waits for
	// a slot that fits both; without a queue it is refused.
	if h.spill == nil {
		h.refuse(w, problemPoolFull.WithRetryAfter(h.retryAfter()), instance, metrics.PathDirect)
		return
	}
	h.queued(w, r, req, requestID, user, start)
}

// behindBacklog reports whether jobs wait in the queue, so a new request
// must queue behind them.
func (h *Handler) behindBacklog() bool {
	return h.spill != nil && h.queueFirst != nil && h.queueFirst()
}

func (h *Handler) retryAfter() int {
	d := h.cfg.PoolRetryAfter
	if h.retryAfterFn != nil {
		d = h.retryAfterFn()
	}
	// Round up: advising a retry before capacity is likely back only
	// brings the client back to another refusal.
	return max(1, int((d+time.Second-1)/time.Second))
}

func (h *Handler) refuse(w http.ResponseWriter, p *protocol.Problem, instance, path string) {
	if path != "" {
		h.m.StreamsTotal.WithLabelValues(path, metrics.OutcomeRefused).Inc()
	}
	WriteProblem(w, p, instance)
}

// admit checks the request and returns it with the caller's identity, or
// the problem to refuse it with.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request) (protocol.ChatRequest, string, *protocol.Problem) {
	user, prob := h.identity(r)
	if prob != nil {
		return protocol.ChatRequest{}, "", prob
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return protocol.ChatRequest{}, "", protocol.NewProblem(protocol.ProblemUnsupportedMedia, "Unsupported Media Type",
			http.StatusUnsupportedMediaType, "Content-Type must be application/json.")
	}
	if r.ContentLength > h.cfg.MaxBodyBytes {
		return protocol.ChatRequest{}, "", tooLarge(h.cfg.MaxBodyBytes)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return protocol.ChatRequest{}, "", tooLarge(h.cfg.MaxBodyBytes)
		}
		return protocol.ChatRequest{}, "", protocol.NewProblem(protocol.ProblemBadRequest, "Bad Request",
			http.StatusBadRequest, "The request body could not be read.")
	}
	req, err := protocol.DecodeChatRequest(body, h.cfg.Limits)
	if err != nil {
		// DecodeChatRequest's errors are written for the client.
		return protocol.ChatRequest{}, "", protocol.NewProblem(protocol.ProblemBadRequest, "Bad Request",
			http.StatusBadRequest, err.Error())
	}
	return req, user, nil
}

func tooLarge(limit int64) *protocol.Problem {
	return protocol.NewProblem(protocol.ProblemBodyTooLarge, "Request Body Too Large",
		http.StatusRequestEntityTooLarge, fmt.Sprintf("The request body must be at most %d bytes.", limit))
}

// identity is the API key's digest when keys are configured, else the
// X-User-ID header, else the client IP.
func (h *Handler) identity(r *http.Request) (string, *protocol.Problem) {
	if len(h.keys) > 0 {
		auth := r.Header.Get("Authorization")
		key, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || key == "" {
			return "", unauthorized("Send Authorization: Bearer <key>.")
		}
		sum := sha256.Sum256([]byte(key))
		match := 0
		for i := range h.keys {
			match |= subtle.ConstantTimeCompare(sum[:], h.keys[i][:])
		}
		if match == 0 {
			return "", unauthorized("The API key is not valid.")
		}
		return "key:" + hex.EncodeToString(sum[:6]), nil
	}
	if uid, ok := r.Header["X-User-Id"]; ok {
		if len(uid) != 1 || !protocol.ValidUserID(uid[0]) {
			return "", protocol.NewProblem(protocol.ProblemBadRequest, "Bad Request", http.StatusBadRequest,
				"X-User-ID must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -")
		}
		return uid[0], nil
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "ip:" + host, nil
}

func unauthorized(detail string) *protocol.Problem {
	return protocol.NewProblem(protocol.ProblemUnauthorized, "Unauthorized", http.StatusUnauthorized, detail)
}

// direct streams from the provider in this process while holding lease.
func (h *Handler) direct(w http.ResponseWriter, r *http.Request, req protocol.ChatRequest, requestID string, lease pool.Lease, start time.Time) {
	defer lease.Release()
	ctx, cancel := context.WithCancel(r.Context())
	frames := make(chan protocol.Result, h.cfg.FrameBuffer)
	var producer sync.WaitGroup
	// The provider call ends before the lease is released: cancel, then
	// wait for the producer (defers run in reverse order).
	defer producer.Wait()
	defer cancel()

	producer.Go(func() {
		seq := 0
		send := func(res protocol.Result) error {
			select {
			case frames <- res:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		result, err := h.provider.Stream(ctx, req, func(content string) error {
			seq++
			return send(protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: seq, Content: content}}})
		})
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("provider failed", "request_id", requestID, "path", metrics.PathDirect, "chunks", seq, "err", err)
			}
			p := protocol.ProviderFailed(0)
			var le *llm.Error
			if errors.As(err, &le) && le.Retryable {
				p.RetryAfterSeconds = max(1, int(le.RetryAfter/time.Second))
			}
			_ = send(protocol.Result{Kind: protocol.KindError, Problem: p})
			return
		}
		usage := result.Usage
		_ = send(protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{
			RequestID: requestID, FinishReason: result.FinishReason, Path: metrics.PathDirect, Usage: &usage,
		}})
	})

	began := time.Now()
	if outcome, _ := h.serve(ctx, w, requestID, metrics.PathDirect, start, frames, nil); outcome == metrics.OutcomeDone && h.serviceDone != nil {
		h.serviceDone(time.Since(began))
	}
}

// queued hands the request to the queue and relays what the workers
// publish. The relay is subscribed before the job is enqueued.
func (h *Handler) queued(w http.ResponseWriter, r *http.Request, req protocol.ChatRequest, requestID, user string, start time.Time) {
	instance := "urn:spillway:request:" + requestID
	relay, err := h.spill.Spill(r.Context(), protocol.Job{
		RequestID: requestID, UserID: user, ThreadID: req.ThreadID, Payload: req,
	})
	if err != nil {
		var p *protocol.Problem
		if !errors.As(err, &p) {
			h.log.Error("queue refused job", "request_id", requestID, "err", err)
			p = protocol.QueueUnavailable(h.retryAfter())
		}
		h.refuse(w, p, instance, metrics.PathQueued)
		return
	}
	finished := false
	// Close runs on every exit: a job whose client left is skipped or
	// cancelled by the workers.
	defer func() { relay.Close(finished) }()
	_, finished = h.serve(r.Context(), w, requestID, metrics.PathQueued, start, relay.Results(), relay)
}

// serve writes the stream: it opens the SSE response, then relays frames
// until a terminal one, the client leaves, the relay gives up (relayDone
// closes; problem says why) or the server drains. It returns the outcome,
// and whether the source itself finished (sent done or error).
func (h *Handler) serve(ctx context.Context, w http.ResponseWriter, requestID, path string, start time.Time,
	frames <-chan protocol.Result, relay Relay) (string, bool) {
	sw := NewWriter(w, h.cfg.WriteTimeout)
	active := h.m.ActiveStreams.WithLabelValues(path)
	active.Inc()
	defer active.Dec()

	outcome, finished := h.pump(ctx, sw, requestID, path, start, frames, relay)
	h.m.StreamsTotal.WithLabelValues(path, outcome).Inc()
	return outcome, finished
}

func (h *Handler) pump(ctx context.Context, sw *Writer, requestID, path string, start time.Time,
	frames <-chan protocol.Result, relay Relay) (outcome string, finished bool) {
	if err := sw.Start(requestID, path); err != nil {
		return metrics.OutcomeCancelled, false
	}
	heartbeat := time.NewTimer(h.cfg.Heartbeat)
	defer heartbeat.Stop()
	var relayDone <-chan struct{}
	if relay != nil {
		relayDone = relay.Done()
	}
	firstChunk := true
	fail := func(p *protocol.Problem) string {
		if err := sw.Error(p); err != nil {
			return metrics.OutcomeCancelled
		}
		return metrics.OutcomeError
	}
	sourceSaid := func(outcome string) (string, bool) { return outcome, true }
	for {
		var err error
		select {
		case res, ok := <-frames:
			if !ok {
				h.log.Error("stream source ended without a terminal event", "request_id", requestID, "path", path)
				return fail(problemInternal), false
			}
			switch res.Kind {
			case protocol.KindBatch:
				if firstChunk {
					firstChunk = false
					h.m.TimeToFirstChunk.WithLabelValues(path).Observe(time.Since(start).Seconds())
				}
				for _, c := range res.Chunks {
					if err = sw.Chunk(c.Seq, c.Content); err != nil {
						break
					}
				}
			case protocol.KindReset:
				err = sw.Reset(*res.Reset)
			case protocol.KindDone:
				d := protocol.Done{RequestID: requestID, Path: path, FinishReason: "stop"}
				if res.Done != nil {
					d.FinishReason = cmpOr(res.Done.FinishReason, "stop")
					d.Usage = res.Done.Usage
				}
				if sw.Done(d) != nil {
					return sourceSaid(metrics.OutcomeCancelled)
				}
				return sourceSaid(metrics.OutcomeDone)
			case protocol.KindError:
				return sourceSaid(fail(res.Problem))
			case protocol.KindHeartbeat:
				continue // worker liveness only; the relay tracks it
			}
		case <-heartbeat.C:
			err = sw.Ping()
		case <-relayDone:
			return fail(relay.Problem()), false
		case <-ctx.Done():
			return metrics.OutcomeCancelled, false
		case <-h.draining:
			return fail(problemShuttingDown.WithRetryAfter(1)), false
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				h.log.Warn("client too slow, stream cut", "request_id", requestID, "path", path)
			}
			return metrics.OutcomeCancelled, false
		}
		// Heartbeat on a timer reset after each write.
		if !heartbeat.Stop() {
			select {
			case <-heartbeat.C:
			default:
			}
		}
		heartbeat.Reset(h.cfg.Heartbeat)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
