// Package simserver serves a Provider, normally the simulator, over an
// OpenAI-compatible HTTP API. It is a package of its own, not part of
// cmd/simllm, so that tests elsewhere can run the simulated upstream
// in-process with httptest.
//
// Faults come from the provider's configuration (llm.SimConfig; simllm
// reads them from SIM_* variables, docs/TIMEOUTS.md): a failure before the
// first chunk is answered with its status (503, or 429 and 5xx as
// SIM_FAIL_STATUS says) and Retry-After in whole seconds
// (SIM_RETRY_AFTER_SECONDS), for a share of calls (SIM_FAIL_RATE), the
// first K calls (SIM_FAIL_FIRST) or the calls beyond a concurrency limit
// (SIM_MAX_CONCURRENCY, 429); a slow first token is SIM_FIRST_TOKEN_MS; a
// stall after N chunks (SIM_STALL_AFTER) keeps the response open and
// silent until the client leaves; a failure after the first chunk drops
// the connection.
package simserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/openaiwire"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// ModelID is the one model GET /v1/models lists; a request may name any
// model, which the answer echoes.
const ModelID = "sim-1"

const (
	maxBodyBytes = 4 << 20
	// writeTimeout bounds one write to a client, so a client that stops
	// reading cannot hold a handler forever.
	writeTimeout = 30 * time.Second
)

// Server is an http.Handler for POST /v1/chat/completions (streaming and
// not), GET /v1/models, GET /healthz and GET /metrics. It is safe for
// concurrent use.
type Server struct {
	provider llm.Provider
	log      *slog.Logger
	mux      *http.ServeMux

	requests  atomic.Int64
	cancelled atomic.Int64
	active    atomic.Int64
	peak      atomic.Int64
	throttled atomic.Int64
}

// New returns a server answering with p. A nil logger discards logs.
func New(p llm.Provider, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{provider: p, log: logger, mux: http.NewServeMux()}
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("GET /healthz", s.handleHealth)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry(), promhttp.HandlerOpts{}))
	return s
}

// ServeHTTP routes r.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Requests returns how many chat completion requests arrived, valid or not
// (simllm_requests_total).
func (s *Server) Requests() int64 { return s.requests.Load() }

// Cancelled returns how many chat completions ended because the client
// went away before the answer was complete (simllm_cancelled_total).
func (s *Server) Cancelled() int64 { return s.cancelled.Load() }

// Throttled returns how many chat completions were answered 429
// (simllm_throttled_total).
func (s *Server) Throttled() int64 { return s.throttled.Load() }

// Active returns how many chat completions, streaming or not, are being
// answered now (simllm_active_streams): from their arrival to the last
// write of their answer.
func (s *Server) Active() int64 { return s.active.Load() }

// Peak returns the most chat completions ever answered at once
// (simllm_active_streams_peak): what a gateway's cap on this upstream let
// through.
func (s *Server) Peak() int64 { return s.peak.Load() }

// simLimits are the request limits of the simulator: an upstream's own,
// wider than any api's.
var simLimits = protocol.Limits{MaxMessages: 100000, MaxTokens: 1 << 30, MaxChoices: 128}

type chatRequest struct {
	Model  string
	Stream bool
}

type delta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        delta   `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

type chunk struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Choices []chunkChoice   `json:"choices"`
	Usage   *protocol.Usage `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int              `json:"index"`
	Message      protocol.Message `json:"message"`
	FinishReason string           `json:"finish_reason"`
}

type completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   protocol.Usage     `json:"usage"`
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	rb := http.MaxBytesReader(w, r.Body, maxBodyBytes)
	raw, err := io.ReadAll(rb)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request body is too large")
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "request body could not be read")
		return
	}
	// The server notices a client going away, and cancels r.Context(),
	// only once the body has been read to its end: ReadAll did.
	req, err := protocol.DecodeOpenAIChat(raw, simLimits)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", strings.TrimPrefix(err.Error(), "invalid request: "))
		return
	}
	req.Body = nil // the simulator answers from what it read
	body := chatRequest{Model: req.Model, Stream: req.Stream}
	if body.Model == "" {
		body.Model = ModelID
		req.Model = ModelID
	}
	n := s.active.Add(1)
	ended := sync.OnceFunc(func() { s.active.Add(-1) })
	defer ended()
	for p := s.peak.Load(); n > p; p = s.peak.Load() {
		if s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	a := answer{id: newID(), created: time.Now().Unix(), model: body.Model, ended: ended}
	if body.Stream {
		s.stream(w, r, req, a, req.IncludeUsage)
	} else {
		s.complete(w, r, req, a)
	}
}

type answer struct {
	id      string
	created int64
	model   string
	// ended ends the call's count in simllm_active_streams; it runs just
	// before the last write of the answer (and at the latest when the
	// handler returns). A client cannot have seen the end of its call
	// before that write, so a client that holds calls under a cap never
	// shows more than the cap here, whatever the server does after the
	// last byte.
	ended func()
}

func (a answer) chunk(choices []chunkChoice, usage *protocol.Usage) chunk {
	return chunk{ID: a.id, Object: "chat.completion.chunk", Created: a.created, Model: a.model, Choices: choices, Usage: usage}
}

// stream answers with server-sent events. Headers wait for the first chunk
// so that a failure before it can still be an HTTP error status, as real
// upstreams do; a failure after it drops the connection, which the client
// sees as a stream cut short.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, req protocol.ChatRequest, a answer, includeUsage bool) {
	rc := http.NewResponseController(w)
	started, writeFailed := false, false
	var buf []byte
	sendRaw := func(event []byte) error {
		if !started {
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if err := s.write(w, rc, event); err != nil {
			writeFailed = true
			return err
		}
		return nil
	}
	send := func(c chunk) error {
		b, err := json.Marshal(c)
		if err != nil {
			return fmt.Errorf("simserver: encode chunk: %w", err)
		}
		buf = append(append(append(buf[:0], "data: "...), b...), "\n\n"...)
		return sendRaw(buf)
	}
	first, rich := true, false
	id := protocol.AppendJSONString(nil, a.id)
	res, err := s.provider.Stream(r.Context(), req, func(c protocol.Chunk) error {
		if c.Raw != nil {
			// The simulator's own chunks (tools, reasoning, n choices),
			// with this answer's id; its usage chunk only when asked.
			rich = true
			if !includeUsage && openaiwire.IsUsageChunk(c.Raw) {
				return nil
			}
			return sendRaw(openaiwire.AppendChunkEvent(nil, c.Raw, id))
		}
		d := delta{Content: c.Content}
		if first {
			d.Role, first = "assistant", false
		}
		return send(a.chunk([]chunkChoice{{Delta: d}}, nil))
	})
	if err != nil {
		switch {
		case writeFailed || r.Context().Err() != nil:
			s.cancelled.Add(1)
			s.log.Debug("client went away", "id", a.id, "err", err)
		case !started:
			s.providerError(w, a, err)
		default:
			s.log.Warn("provider failed mid-stream; dropping the connection", "id", a.id, "err", err)
			panic(http.ErrAbortHandler)
		}
		return
	}
	finish := res.FinishReason
	if !rich {
		err = send(a.chunk([]chunkChoice{{Delta: delta{}, FinishReason: &finish}}, nil))
	}
	if err == nil && includeUsage && !rich {
		u := res.Usage
		err = send(a.chunk([]chunkChoice{}, &u))
	}
	if err == nil {
		a.ended()
		err = s.write(w, rc, []byte("data: [DONE]\n\n"))
	}
	if err != nil {
		s.cancelled.Add(1)
		s.log.Debug("client went away", "id", a.id, "err", err)
	}
}

func (s *Server) write(w http.ResponseWriter, rc *http.ResponseController, b []byte) error {
	_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout)) // unsupported by some test writers; best effort
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("simserver: write: %w", err)
	}
	if err := rc.Flush(); err != nil {
		return fmt.Errorf("simserver: flush: %w", err)
	}
	return nil
}

// complete answers with one chat.completion object.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, req protocol.ChatRequest, a answer) {
	var text strings.Builder
	asm := openaiwire.NewAssembler("", a.model, a.created)
	rich := false
	res, err := s.provider.Stream(r.Context(), req, func(c protocol.Chunk) error {
		if c.Raw != nil {
			rich = true
			asm.Chunk(c.Raw)
		}
		text.WriteString(c.Content)
		return nil
	})
	if err != nil {
		if r.Context().Err() != nil {
			s.cancelled.Add(1)
			s.log.Debug("client went away", "id", a.id, "err", err)
			return
		}
		s.providerError(w, a, err)
		return
	}
	a.ended()
	if rich {
		asm.Finish(res.FinishReason, &res.Usage)
		obj, _ := protocol.SetMember(asm.Object(), "id", protocol.AppendJSONString(nil, a.id))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(append(obj, '\n'))
		return
	}
	writeJSON(w, http.StatusOK, completion{
		ID: a.id, Object: "chat.completion", Created: a.created, Model: a.model,
		Choices: []completionChoice{{
			Message:      protocol.Message{Role: "assistant", Content: text.String()},
			FinishReason: res.FinishReason,
		}},
		Usage: res.Usage,
	})
}

// providerError answers a failure before any of the answer was sent with
// the provider's status (502 when it has none), and Retry-After when known.
func (s *Server) providerError(w http.ResponseWriter, a answer, err error) {
	status := http.StatusBadGateway
	var pe *llm.Error
	if errors.As(err, &pe) {
		if pe.Status >= 400 && pe.Status <= 599 {
			status = pe.Status
		}
		if pe.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(protocol.RetryAfterSeconds(pe.RetryAfter)))
		}
	}
	if status == http.StatusTooManyRequests {
		s.throttled.Add(1)
	}
	s.log.Info("provider failed", "id", a.id, "status", status, "err", err)
	a.ended()
	writeError(w, status, "server_error", "the simulated provider failed; retry the request")
}

// registry exposes the server's counters on a registry of its own, so that
// several servers in one test process do not collide. The atomics stay the
// source of truth; the collectors read them at scrape time.
func (s *Server) registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "simllm_requests_total",
			Help: "Chat completion requests received.",
		}, func() float64 { return float64(s.Requests()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "simllm_cancelled_total",
			Help: "Chat completions whose client went away before the answer was complete.",
		}, func() float64 { return float64(s.Cancelled()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "simllm_throttled_total",
			Help: "Chat completions answered 429 Too Many Requests.",
		}, func() float64 { return float64(s.Throttled()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "simllm_active_streams",
			Help: "Chat completions being answered now (until the last write of their answer).",
		}, func() float64 { return float64(s.Active()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "simllm_active_streams_peak",
			Help: "The most chat completions answered at once since start.",
		}, func() float64 { return float64(s.Peak()) }),
	)
	return reg
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: ModelID, Object: "model", Created: 0, OwnedBy: "spillway"}}})
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// writeError writes an error in the OpenAI shape. msg is written for the
// client; it never holds internal error text.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	type apiError struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	writeJSON(w, status, struct {
		Error apiError `json:"error"`
	}{apiError{Message: msg, Type: typ}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // the values written here are plain structs
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func newID() string {
	return fmt.Sprintf("chatcmpl-%016x%08x", rand.Uint64(), rand.Uint32())
}
