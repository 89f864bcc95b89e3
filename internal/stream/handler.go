package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/identity"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/shrinkmap"
	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

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
	// LogWriter keeps every stream's events for a resume, LogReader reads
	// them back (streamlog implements both); nil LogReader disables
	// GET and DELETE /v1/streams/{id}.
	LogWriter LogWriter
	LogReader LogReader
	// Positions, when the queue has one (failover.Positioner), tells
	// waiting requests where they stand; nil sends no queued events.
	Positions failover.Positioner
	// Canceller tells whichever process runs a stream (and the workers)
	// that its owner stopped it; nil stops only streams of this process.
	Canceller failover.Canceller
	// Tracing adds the spans of docs/TRACING.md; nil traces nothing.
	Tracing *telemetry.Provider
	// Hold, when set, is called as a waiting stream parks (its handler
	// returns while it goes on, Handler.park); the func it returns is
	// called once the stream ended. A server counts the stream as open in
	// between, as it counted its request.
	Hold func() (release func())
	// Ended, when set, is told how each request the direct path answered
	// itself ended: the provider's last error, nil for a complete answer.
	// A request handed to the queue is told by its worker instead, and
	// one whose client left is not told. It must not block.
	Ended func(err error)
}

// LogWriter appends to the per-request stream log without waiting for
// Redis (streamlog.Appender). Safe for concurrent use.
type LogWriter interface {
	Open(requestID, owner string) bool
	Append(requestID string, ev streamlog.Event) bool
}

// LogReader reads stream logs back (streamlog.Reader). Safe for
// concurrent use; every method does one Redis call bounded by ctx.
type LogReader interface {
	Owner(ctx context.Context, requestID string) (string, error)
	Read(ctx context.Context, requestID string, cur streamlog.Cursor, block time.Duration) ([]streamlog.Event, streamlog.Cursor, error)
	Live(ctx context.Context, requestID string) (bool, error)
	Attach(ctx context.Context, requestID string, ttl time.Duration) error
	Attached(ctx context.Context, requestID string) (bool, error)
}

// Handler serves POST /v1/stream (docs/API.md). Its steps, one file each:
// auth.go (who is asking), parse.go (the request), this file (which
// path), direct.go and queued.go (the two producers), write.go (the write
// loop).
type Handler struct {
	cfg       Config
	pool      pool.Pool
	provider  llm.Provider
	spill     failover.Spiller
	gate      Gate
	m         Metrics
	log       *slog.Logger
	ids       *identity.Resolver
	models    map[string]bool // nil: any model
	served    map[string]bool // nil: any model; else also "" (the upstreams choose)
	logw      LogWriter
	logr      LogReader
	canceller failover.Canceller
	progress  *progress // nil without Deps.Positions
	tel       *telemetry.Provider
	hold      func() func()
	ended     func(err error)
	bodies    *bodyBudget // nil: no BODY_BYTES_IN_FLIGHT

	liveMu sync.Mutex
	// live holds the streams of this process by request id, each with a
	// channel closed to stop it; it gives its room back after a burst.
	live shrinkmap.Map[string, chan struct{}]
	// taken holds the connections waiting streams took over from
	// net/http, which http.Server.Close does not see (Cut).
	taken shrinkmap.Map[net.Conn, struct{}]

	drainOnce sync.Once
	draining  chan struct{}
	wg        sync.WaitGroup
}

// New returns a handler.
func New(cfg Config, deps Deps) (*Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Pool == nil || deps.Provider == nil || deps.Log == nil {
		return nil, errors.New("stream: pool, provider and logger are required")
	}
	if deps.Gate == nil {
		deps.Gate = openGate{retryAfter: cfg.PoolRetryAfter}
	}
	if deps.Metrics == nil {
		deps.Metrics = nopMetrics{}
	}
	ids, err := newResolver(cfg)
	if err != nil {
		return nil, fmt.Errorf("stream: identity settings: %w", err)
	}
	var models map[string]bool
	for _, m := range cfg.Models {
		if models == nil {
			models = make(map[string]bool)
		}
		models[m] = true
	}
	var served map[string]bool
	if len(cfg.ServedModels) > 0 {
		served = map[string]bool{"": true}
		for _, m := range cfg.ServedModels {
			served[m] = true
		}
	}
	return &Handler{cfg: cfg, pool: deps.Pool, provider: deps.Provider, spill: deps.Spiller, gate: deps.Gate,
		m: deps.Metrics, log: deps.Log, ids: ids, models: models, served: served, tel: deps.Tracing, draining: make(chan struct{}),
		logw: deps.LogWriter, logr: deps.LogReader, canceller: deps.Canceller, hold: deps.Hold, ended: deps.Ended,
		progress: newProgress(deps.Positions), bodies: newBodyBudget(cfg.BodyBytesInFlight)}, nil
}

// Drain makes every open stream end now with an `error` event of type
// shutting-down. It is called when the shutdown grace period is over.
func (h *Handler) Drain() { h.drainOnce.Do(func() { close(h.draining) }) }

// Wait blocks until every stream the handler started has ended.
func (h *Handler) Wait() { h.wg.Wait() }

// Cut closes the connections of the streams that are still open although
// Drain ended them: their clients stopped reading the last event. It is
// http.Server.Close for the connections the handler took over from
// net/http (see takeOver), which the server no longer tracks.
func (h *Handler) Cut() {
	h.liveMu.Lock()
	defer h.liveMu.Unlock()
	for c := range h.taken.All() {
		_ = c.Close()
	}
}

// takeOver lets the writer of s, a queued stream that may wait long,
// take its connection over from net/http (Writer.takeOver); the
// connection is tracked until giveBack.
func (h *Handler) takeOver(s *session, r *http.Request) {
	sw := s.sink.sse()
	if sw == nil {
		return
	}
	gone, ok := sw.takeOver(r)
	if !ok {
		return
	}
	s.gone, s.taken = gone, sw
	h.liveMu.Lock()
	h.taken.Set(sw.conn, struct{}{})
	h.liveMu.Unlock()
}

// giveBack closes the connection sw took over, once its stream ended.
func (h *Handler) giveBack(sw *Writer) {
	h.liveMu.Lock()
	h.taken.Delete(sw.conn)
	h.liveMu.Unlock()
	sw.finish()
}

// instanceOf is the problem `instance` of a request (docs/API.md).
func instanceOf(requestID string) string { return "urn:spillway:request:" + requestID }

// exchange is one request on its way through the handler's steps.
type exchange struct {
	w         http.ResponseWriter
	r         *http.Request
	d         dialect
	requestID string
	start     time.Time
	req       protocol.ChatRequest
	user      string            // the identity's name: pool, queue and limits key on it
	id        identity.Identity // who is asking (docs/API.md, "Identity")
	open      opener            // set once the request was read
	prio      protocol.Priority // effective priority, after the caller's maximum
	session   string            // X-Session-ID: the affinity key of several upstreams
	// bodyHeld is the bytes of the body's taken from the budget, until
	// they are given back (giveBody): atomic, as a hand-off to the queue
	// gives them back from the direct call's goroutine.
	bodyHeld atomic.Int64
}

// ServeHTTP parses the request, finds the caller's identity and streams
// the answer on the direct or queued path.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.serve(w, r, native{}) }

// serve runs one request of dialect d through the steps every endpoint
// shares: identity, admission, path choice.
//
// A queued stream waits its first second (TakeOverAfter) with this
// goroutine under serve, then parks in a goroutine of its own (park);
// one that cannot be taken over (HTTP/1.0) waits here to its end. A
// goroutine's stack only shrinks at a collection when less than a
// quarter of it is in use: every byte of the frames below the wait
// counts, 10,000 times over (docs/bench-history/2026-11.md, "Waiting streams"). So
// serve and queued keep small frames: the steps with many temporaries
// (parsing, admission, the direct path, the hand-over to the queue) run
// in functions of their own that have returned before a stream waits,
// and the session's loop runs right under serve.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request, d dialect) {
	h.wg.Add(1)
	defer h.wg.Done()
	x := h.admitted(w, r, d)
	if x == nil {
		return
	}
	// Each path gives the body back as soon as it is done with it; this
	// is for a panic on the way.
	defer h.releaseBody(x)
	if h.tryDirect(x) {
		return
	}
	if s := h.queued(x); s != nil {
		if s.serve(r.Context()); s.parked {
			h.park(s)
		}
	}
}

// park goes on with s, a waiting stream whose writer took its connection
// over (Writer.takeOver), in a goroutine of its own, so that the handler
// returns: net/http's request, response and
// connection state, gin's context and the handler's 8 KiB stack are
// given back while the stream waits (docs/bench-history/2026-11.md, "Waiting
// streams"). The request's server span ends with the handler; the rest of
// the stream is traced in spillway.stream.parked (docs/TRACING.md). Deps.
// Hold keeps the stream counted as open until it ends.
func (h *Handler) park(s *session) {
	s.parked = false // from here on, the loop runs to the stream's end
	s.ctx, s.parkSpan = h.tel.StartParked(s.ctx)
	// The writer writes to the connection only: the ResponseWriter,
	// recycled once the handler returned, must not be touched again.
	s.taken.w, s.taken.rc = nil, nil
	release := func() {}
	if h.hold != nil {
		release = h.hold()
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer release()
		defer s.release()
		defer func() {
			// net/http would have caught a panic of the handler's; this
			// goroutine is no longer under it.
			if p := recover(); p != nil {
				h.log.Error("parked stream panicked", "request_id", s.requestID, "panic", p, "stack", string(debug.Stack()))
			}
		}()
		s.loop()
	}()
}

// admitted reads the request and runs admission; it returns nil when the
// request was refused (and answered).
//
//go:noinline
func (h *Handler) admitted(w http.ResponseWriter, r *http.Request, d dialect) (admitted *exchange) {
	x := &exchange{w: w, r: r, d: d, requestID: uuid.NewString(), start: time.Now()}
	defer func() {
		if admitted == nil {
			h.releaseBody(x)
		}
	}()
	setRequestID(w.Header(), x.requestID)
	// The server span (otelgin) names the request.
	telemetry.SetRequest(trace.SpanFromContext(r.Context()), x.requestID, "")

	prob := h.parseRequest(x)
	if prob == nil {
		x.prio, prob = h.priority(x)
	}
	if prob == nil {
		x.session, prob = sessionID(r)
	}
	if prob == nil {
		telemetry.SetRequest(trace.SpanFromContext(r.Context()), x.requestID, string(x.prio))
	}
	if prob == nil {
		prob = h.admit(r.Context(), x.user, x.prio)
	}
	if prob != nil {
		h.refuse(x, prob, "")
		return nil
	}
	// Under degradation a request may get fewer tokens than it asked
	// for, on either path (docs/OPERATIONS.md, "Degradation levels").
	// The cap goes into the forwarded body, in the field the client used
	// (docs/API.md, "What passes untouched").
	if c := h.gate.MaxTokens(x.prio); c > 0 {
		x.req.CapTokens(c)
	}
	return x
}

// tryDirect serves x on the direct path when it is on, no job waits and
// a slot is free, and refuses it when it cannot go to a queue either; it
// reports whether x was answered. Otherwise the request goes to the
// queue, marked so on its span.
//
//go:noinline
func (h *Handler) tryDirect(x *exchange) bool {
	span := trace.SpanFromContext(x.r.Context())
	if h.cfg.DirectPathEnabled && !h.behindBacklog() {
		lease, err := h.tryAcquire(x.r.Context(), x.user)
		limit := "global"
		if err == nil {
			res, ok := h.reserveUpstream(x)
			if ok {
				telemetry.SetPath(span, protocol.PathDirect)
				h.direct(x, lease, res)
				h.releaseBody(x)
				return true
			}
			lease.Release()
			limit = "upstream"
		} else if errors.Is(err, pool.ErrUserLimit) {
			limit = "user"
		}
		h.m.PoolRefused(limit)
	}
	// Either limit sends the request to the queue, where a worker waits for
	// a slot that fits both; without a queue it is refused.
	if h.spill == nil {
		h.refuse(x, protocol.PoolExhausted(h.retryAfter()), protocol.PathDirect)
		return true
	}
	telemetry.SetPath(span, protocol.PathQueued)
	return false
}

// behindBacklog reports whether jobs wait in the queue, so a new request
// must queue behind them (docs/QUEUE.md, invariant 4).
func (h *Handler) behindBacklog() bool {
	return h.spill != nil && h.gate.QueueFirst()
}

// retryAfter is the Retry-After, in whole seconds, for a full pool.
func (h *Handler) retryAfter() int {
	return protocol.RetryAfterSeconds(h.gate.RetryAfter())
}

// refuse answers with p before any stream opened; path is empty when the
// request was refused before a path was chosen.
func (h *Handler) refuse(x *exchange, p *protocol.Problem, path string) {
	if path != "" {
		h.m.StreamEnded(path, OutcomeRefused)
	}
	x.d.refuse(x.w, p, instanceOf(x.requestID))
}

func newProgress(q failover.Positioner) *progress {
	if q == nil {
		return nil
	}
	return &progress{q: q}
}
