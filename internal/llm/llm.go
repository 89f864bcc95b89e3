// Package llm owns the model providers: the Provider interface, an
// OpenAI-compatible streaming client and the deterministic in-process
// simulator used by embedded mode, simllm, tests and the load tool.
package llm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Provider streams one answer.
//
// Stream calls emit once per chunk, in order, from the calling goroutine,
// and returns when the answer is complete, when emit returns an error (which
// Stream then returns, wrapped), or promptly (well under a second) after ctx
// ends, returning an error that wraps ctx.Err(). Implementations are safe for
// concurrent use. On failure the returned error is an *Error when the
// provider knows whether a retry may help.
//
// A chunk's Content stays valid; its Raw is valid only until emit
// returns (the OpenAI client hands out its read buffer): a caller that
// keeps the raw chunk past emit copies it.
type Provider interface {
	Name() string
	Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (Result, error)
}

// Result describes a completed answer.
type Result struct {
	FinishReason string // "stop" or "length"
	Usage        protocol.Usage
}

// Error is a provider failure that says whether a retry may succeed. It
// carries what the upstream said: its HTTP status and Retry-After.
// CountsAgainstBreaker, IsClientError, Reason and RetryPolicy.Delay read it.
type Error struct {
	// Retryable reports that the same request may succeed if sent again.
	// Whether a retry is safe also depends on whether any chunk reached the
	// client, which only the caller knows.
	Retryable bool
	// Status is the HTTP status of the upstream response the failure came
	// with: 429 or 503 for a refusal, 200 for a failure in the middle of a
	// stream, 0 when no response arrived (a refused connection, a timeout
	// before the response headers).
	Status int
	// RetryAfter is the upstream's Retry-After, 0 when none.
	RetryAfter time.Duration
	// Err is the cause, for logs.
	Err error
	// Body is the upstream's response body when it refused the request
	// (IsClientError), bounded: the client gets it as it was sent
	// (protocol.ProviderRejected). Nil otherwise.
	Body []byte
}

// Error describes the failure for logs; it is never shown to clients.
func (e *Error) Error() string {
	kind := "permanent"
	if e.Retryable {
		kind = "retryable"
	}
	if e.Status != 0 {
		return fmt.Sprintf("llm: %s error (status %d): %v", kind, e.Status, e.Err)
	}
	return fmt.Sprintf("llm: %s error: %v", kind, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// IsRetryable reports whether err is a provider failure a retry may cure:
// an *Error marked Retryable (upstream 429 and 5xx, connection failures,
// streams cut short, ErrFirstTokenTimeout, ErrIdleTimeout,
// ErrTotalTimeout). Context cancellation, errors returned by emit and
// client errors (IsClientError) are never retryable. A retry after a chunk
// reached the client would repeat it: the caller must not retry then, even
// when IsRetryable says yes.
func IsRetryable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, ErrNoCapacity) {
		return true
	}
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

type capacityWaitKey struct{}

// WithCapacityWait marks ctx as a call that would rather wait for provider
// capacity than fail with ErrNoCapacity: a queue worker's, which waits for
// an upstream slot as it waits for a pool slot. The api's direct path does
// not wait: a full upstream sends its request to the queue.
func WithCapacityWait(ctx context.Context) context.Context {
	return context.WithValue(ctx, capacityWaitKey{}, true)
}

// CapacityWait reports whether ctx was marked by WithCapacityWait.
func CapacityWait(ctx context.Context) bool {
	v, _ := ctx.Value(capacityWaitKey{}).(bool)
	return v
}

// Caller says whom a call is for, to a provider that routes or orders
// calls by it (the several-upstreams balancer, docs/UPSTREAMS.md). Every
// field is optional.
type Caller struct {
	// Identity is who the pool counts the request against: waiting calls
	// take turns round-robin between identities.
	Identity string
	// Session is the affinity key: the X-Session-ID header, else the
	// body's thread_id, else the identity.
	Session string
	// Since is when the work was queued (a queued job's enqueue time):
	// the call's place in line among one identity's waiting calls. Zero
	// is when the call starts waiting.
	Since time.Time
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the Caller ctx carries, or the zero Caller.
func CallerFrom(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// Reserver is a Provider with a capacity of its own, such as several
// capped upstreams: the api's direct path reserves before it commits to
// the direct path, so a request that finds no capacity goes to the queue
// exactly as one that finds the pool full.
type Reserver interface {
	Provider
	// Reserve holds capacity for req without waiting. An error wrapping
	// ErrNoCapacity means none now; any other error is the one Stream
	// would have returned.
	Reserve(ctx context.Context, req protocol.ChatRequest) (Reservation, error)
}

// Reservation is capacity held for one call by a Reserver. Stream makes
// the call and uses the reservation up; Release gives it back unused. A
// Reservation is used by one goroutine: Release must not run while Stream
// does.
type Reservation interface {
	Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (Result, error)
	Release()
}

// ReadWatcher is told when a provider is about to wait for more of a
// streamed answer, so that its caller can send what it gathered from the
// chunks emitted so far at that moment: in one write for all the chunks
// one read brought, and never held while the upstream is silent. Stream
// finds it in its context (WithReadWatcher). Both methods are called on
// the goroutine that calls emit.
type ReadWatcher interface {
	// Reading is called with true when the provider starts reading an
	// answer and will call BeforeRead before every read of it that may
	// wait, and with false when it stops reading it (an attempt that
	// ended). A provider that never calls it never calls BeforeRead.
	Reading(on bool)
	// BeforeRead is called before each read of the answer that may wait
	// for the upstream.
	BeforeRead()
}

type readWatcherKey struct{}

// WithReadWatcher returns ctx carrying w for the provider's Stream.
func WithReadWatcher(ctx context.Context, w ReadWatcher) context.Context {
	return context.WithValue(ctx, readWatcherKey{}, w)
}

// readWatcherOf returns the ReadWatcher ctx carries, or nil.
func readWatcherOf(ctx context.Context) ReadWatcher {
	w, _ := ctx.Value(readWatcherKey{}).(ReadWatcher)
	return w
}
