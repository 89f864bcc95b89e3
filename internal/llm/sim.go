package llm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// maxSimTokens bounds SimConfig.Tokens so a typo cannot make every answer
// allocate gigabytes.
const maxSimTokens = 1 << 20

// ErrSimulatedFault is wrapped by every failure the simulator injects.
var ErrSimulatedFault = errors.New("llm: simulated fault")

// SimConfig configures the simulated provider. The zero value is not valid
// (Tokens must be at least 1); DefaultSimConfig gives the documented defaults.
type SimConfig struct {
	// FirstToken is the wait before the first chunk (SIM_FIRST_TOKEN_MS,
	// default 150ms).
	FirstToken time.Duration
	// TokenInterval is the wait between two chunks (SIM_TOKEN_MS, default
	// 20ms).
	TokenInterval time.Duration
	// Tokens is the number of chunks of a complete answer (SIM_TOKENS,
	// default 48), from 1 to 1048576.
	Tokens int
	// Seed selects the text (SIM_SEED, default 1). Every process given the
	// same seed gives the same messages the same answer.
	Seed int64
	// FailRate is the probability, from 0 to 1, that a call fails before its
	// first chunk with a retryable *Error of Status FailStatus
	// (SIM_FAIL_RATE, default 0).
	FailRate float64
	// FailMidstreamRate is the probability, from 0 to 1, that a call fails
	// after about half of its chunks with a retryable *Error of Status 502
	// (SIM_FAIL_MIDSTREAM_RATE, default 0).
	FailMidstreamRate float64
	// FailFirst makes the first FailFirst calls to Stream of this Sim fail
	// before their first chunk, as FailRate does, whatever the rates say:
	// a number of failed attempts before a success (SIM_FAIL_FIRST in
	// simllm, default 0).
	FailFirst int
	// FailStatus is the HTTP status of the failures FailRate and FailFirst
	// inject: 429 or 500 to 599 (SIM_FAIL_STATUS in simllm, default 0,
	// meaning 503).
	FailStatus int
	// FailRetryAfter is the Retry-After of the failures FailRate, FailFirst
	// and MaxConcurrency inject; simserver sends it in whole seconds, at
	// least 1 (SIM_RETRY_AFTER_SECONDS in simllm, default 0: none).
	FailRetryAfter time.Duration
	// StallAfter makes a call fall silent once it has emitted StallAfter
	// chunks, until its context ends, as a stuck upstream does; an answer
	// of fewer chunks completes (SIM_STALL_AFTER in simllm, default 0:
	// off).
	StallAfter int
	// MaxConcurrency makes a call fail at once with a retryable 429 when
	// MaxConcurrency calls are already in flight, as an upstream limited to
	// that many concurrent requests does (SIM_MAX_CONCURRENCY in simllm,
	// default 0: no limit).
	MaxConcurrency int
}

// DefaultSimConfig returns the defaults docs/OPERATIONS.md gives for the SIM_*
// settings.
func DefaultSimConfig() SimConfig {
	return SimConfig{
		FirstToken:    150 * time.Millisecond,
		TokenInterval: 20 * time.Millisecond,
		Tokens:        48,
		Seed:          1,
	}
}

// Validate reports bad values, each field out of range as a
// *bounds.Error.
func (c SimConfig) Validate() error {
	errs := []error{
		bounds.AtLeast("FirstToken", c.FirstToken, 0),
		bounds.AtLeast("TokenInterval", c.TokenInterval, 0),
		bounds.AtLeast("Tokens", c.Tokens, 1),
		bounds.AtMost("Tokens", c.Tokens, maxSimTokens),
		bounds.Fraction("FailRate", c.FailRate),
		bounds.Fraction("FailMidstreamRate", c.FailMidstreamRate),
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("llm: sim: %w", err)
	}
	switch {
	case c.FailFirst < 0:
		return fmt.Errorf("llm: sim: FailFirst %d is negative", c.FailFirst)
	case c.FailStatus != 0 && c.FailStatus != 429 && (c.FailStatus < 500 || c.FailStatus > 599):
		return fmt.Errorf("llm: sim: FailStatus %d is not 429 or from 500 to 599", c.FailStatus)
	case c.FailRetryAfter < 0:
		return fmt.Errorf("llm: sim: FailRetryAfter %s is negative", c.FailRetryAfter)
	case c.StallAfter < 0:
		return fmt.Errorf("llm: sim: StallAfter %d is negative", c.StallAfter)
	case c.MaxConcurrency < 0:
		return fmt.Errorf("llm: sim: MaxConcurrency %d is negative", c.MaxConcurrency)
	}
	return nil
}

// Sim is the deterministic simulated provider used by embedded mode, simllm,
// tests and the load tool. Its answer to a request is SimChunks of the
// request's messages; only pacing and injected faults vary between calls.
// It is safe for concurrent use.
type Sim struct {
	cfg      SimConfig
	calls    atomic.Int64 // calls to Stream so far, for FailFirst
	inFlight atomic.Int64 // calls admitted and not returned, for MaxConcurrency
}

var _ Provider = (*Sim)(nil)

// NewSim returns a simulator configured by cfg, or the error of
// cfg.Validate.
func NewSim(cfg SimConfig) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Sim{cfg: cfg}, nil
}

// Name returns "sim".
func (s *Sim) Name() string { return "sim" }

// Stream emits the simulated answer to req.Messages: SimChunks truncated to
// req.MaxTokens chunks (finish reason "length") when that is positive and
// smaller than SimConfig.Tokens, else all of them (finish reason "stop").
// req.Model and req.Temperature do not change the text. Usage counts the
// words of all message contents as prompt tokens (at least 1) and the
// emitted chunks as completion tokens.
func (s *Sim) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("sim: %w", err)
	}
	if s.cfg.MaxConcurrency > 0 {
		if !s.admit() {
			return Result{}, &Error{Retryable: true, Status: 429, RetryAfter: s.cfg.FailRetryAfter,
				Err: fmt.Errorf("sim: more than %d calls in flight: %w", s.cfg.MaxConcurrency, ErrSimulatedFault)}
		}
		defer s.inFlight.Add(-1)
	}
	// The fault dice come from the global source, never from the text's
	// seeded source, so a retry of the same request can succeed.
	call := s.calls.Add(1)
	if call <= int64(s.cfg.FailFirst) || (s.cfg.FailRate > 0 && rand.Float64() < s.cfg.FailRate) {
		status := s.cfg.FailStatus
		if status == 0 {
			status = 503
		}
		return Result{}, &Error{Retryable: true, Status: status, RetryAfter: s.cfg.FailRetryAfter,
			Err: fmt.Errorf("sim: fail before first chunk: %w", ErrSimulatedFault)}
	}
	chunks := SimChunks(req.Messages, s.cfg.Seed, s.cfg.Tokens)
	finish := "stop"
	if req.MaxTokens > 0 && req.MaxTokens < len(chunks) {
		chunks = chunks[:req.MaxTokens]
		finish = "length"
	}
	prompt := max(1, simPromptTokens(req.Messages))
	usage := protocol.Usage{PromptTokens: prompt, CompletionTokens: len(chunks), TotalTokens: prompt + len(chunks)}
	var steps []protocol.Chunk
	if req.Route == protocol.RouteCompletions && req.Stream {
		steps = completionsSteps(req, chunks, finish)
	} else if req.WholeAnswer() {
		if req.Route == protocol.RouteEmbeddings {
			usage.CompletionTokens, usage.TotalTokens = 0, prompt
		}
		steps = wholeSteps(req, chunks, usage, finish)
	} else if req.Route == protocol.RouteResponses {
		steps = responsesSteps(req, chunks, usage, finish)
	} else if rich(req) {
		steps, finish = richSteps(req, chunks, finish)
		out := 0
		for _, c := range steps {
			if c.Output() {
				out++
			}
		}
		usage.CompletionTokens, usage.TotalTokens = out, prompt+out
	} else {
		steps = make([]protocol.Chunk, len(chunks))
		for i, c := range chunks {
			steps[i] = protocol.Chunk{Content: c}
		}
	}
	failAt := -1 // index of the chunk the call fails before
	if s.cfg.FailMidstreamRate > 0 && rand.Float64() < s.cfg.FailMidstreamRate {
		failAt = max(1, len(steps)/2)
	}
	for i, c := range steps {
		if i > 0 && i == s.cfg.StallAfter {
			<-ctx.Done()
			return Result{}, fmt.Errorf("sim: stalled after %d chunks: %w", i, ctx.Err())
		}
		wait := s.cfg.TokenInterval
		if i == 0 {
			wait = s.cfg.FirstToken
		}
		if err := sleepCtx(ctx, wait); err != nil {
			return Result{}, fmt.Errorf("sim: after %d chunks: %w", i, err)
		}
		if i == failAt {
			return Result{}, &Error{Retryable: true, Status: 502,
				Err: fmt.Errorf("sim: fail after %d chunks: %w", i, ErrSimulatedFault)}
		}
		if err := emit(c); err != nil {
			return Result{}, fmt.Errorf("sim: emit chunk %d: %w", i+1, err)
		}
	}
	if failAt >= len(steps) { // a one-chunk answer fails after its only chunk
		return Result{}, &Error{Retryable: true, Status: 502,
			Err: fmt.Errorf("sim: fail after %d chunks: %w", len(steps), ErrSimulatedFault)}
	}
	if rich(req) && req.Route != protocol.RouteResponses && !protocol.Whole(req.Route) {
		// As an upstream asked for usage: a last chunk of no choices.
		if err := emit(protocol.Chunk{Raw: newSimChunkWriter(req.Model).usage(usage)}); err != nil {
			return Result{}, fmt.Errorf("sim: emit usage: %w", err)
		}
	}
	return Result{FinishReason: finish, Usage: usage}, nil
}

// admit takes an in-flight place if fewer than MaxConcurrency are taken.
func (s *Sim) admit() bool {
	for {
		n := s.inFlight.Load()
		if n >= int64(s.cfg.MaxConcurrency) {
			return false
		}
		if s.inFlight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// sleepCtx waits d or until ctx ends, whichever comes first, and returns
// ctx.Err() in the second case.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func simPromptTokens(msgs []protocol.Message) int {
	n := 0
	for _, m := range msgs {
		n += len(strings.Fields(m.Content))
	}
	return n
}

// simWords is the simulator's vocabulary. A few entries are multi-byte UTF-8
// so every consumer of simulated text meets non-ASCII early. No entry may
// hold CR, LF or NUL (tests check every chunk).
var simWords = [...]string{
	"the", "the", "the", "a", "a", "an", "of", "of", "to", "to", "and", "and",
	"in", "is", "it", "that", "with", "for", "on", "as", "we", "you", "this",
	"every", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "river",
	"stream", "token", "spillway", "queue", "worker", "answer", "light",
	"model", "gateway", "request", "signal", "morning", "coffee", "window",
	"garden", "music", "simple", "careful", "bright", "quiet", "steady",
	"gentle", "patient", "reliable", "channel", "message", "server", "client",
	"batch", "retry", "backoff", "heartbeat", "latency", "throughput",
	"buffer", "pattern", "question", "mountain", "library", "evening",
	"café", "naïve", "façade", "jalapeño", "über", "résumé", "déjà", "crème",
	"smörgåsbord", "piñata", "東京", "🙂",
}

var simSentenceEnds = [...]string{".", ".", ".", "!", "?"}

// SimChunks returns the simulated answer of tokens chunks to msgs under
// seed: plausible words, one per chunk (a long ASCII word is now and then
// split over two chunks, as tokenizers do), sentences capitalized and
// punctuated, the first chunk without a leading space, the last ending a
// sentence. The result depends only on the roles and contents of msgs, in
// order, on seed and on tokens; it holds no CR, LF or NUL and no empty
// chunk. It uses only the PCG generator's raw output, whose algorithm Go
// fixes, so processes built by different Go releases agree. tokens < 1
// gives nil.
func SimChunks(msgs []protocol.Message, seed int64, tokens int) []string {
	if tokens < 1 {
		return nil
	}
	// Every field is length-prefixed so that message boundaries are part
	// of the hash: ["ab"] and ["a","b"] give different answers.
	h := fnv.New64a()
	var n [8]byte
	field := func(s string) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	binary.LittleEndian.PutUint64(n[:], uint64(seed))
	h.Write(n[:])
	for _, m := range msgs {
		field(m.Role)
		field(m.Content)
	}
	src := rand.NewPCG(h.Sum64(), uint64(seed)^0x9e3779b97f4a7c15)
	pick := func(k int) int { return int(src.Uint64() % uint64(k)) }

	chunks := make([]string, 0, tokens)
	sentenceStart := true
	words, sentenceLen := 0, 6+pick(10)
	for len(chunks) < tokens {
		w := simWords[pick(len(simWords))]
		if sentenceStart {
			w = capitalize(w)
		}
		words++
		sentenceStart = false
		switch {
		case words >= sentenceLen:
			w += simSentenceEnds[pick(len(simSentenceEnds))]
			sentenceStart = true
			words, sentenceLen = 0, 6+pick(10)
		case words > 2 && pick(8) == 0:
			w += ","
		}
		prefix := " "
		if len(chunks) == 0 {
			prefix = ""
		}
		piece := prefix + w
		if len(w) >= 7 && isASCII(w) && len(chunks)+2 <= tokens && pick(4) == 0 {
			cut := len(prefix) + 3 + pick(len(w)-5) // at least 3 bytes each side
			chunks = append(chunks, piece[:cut], piece[cut:])
			continue
		}
		chunks = append(chunks, piece)
	}
	last := chunks[len(chunks)-1]
	switch {
	case strings.HasSuffix(last, ","):
		chunks[len(chunks)-1] = last[:len(last)-1] + "."
	case !strings.HasSuffix(last, ".") && !strings.HasSuffix(last, "!") && !strings.HasSuffix(last, "?"):
		chunks[len(chunks)-1] = last + "."
	}
	return chunks
}

func capitalize(w string) string {
	r, size := utf8.DecodeRuneInString(w)
	u := unicode.ToUpper(r)
	if u == r {
		return w
	}
	return string(u) + w[size:]
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
