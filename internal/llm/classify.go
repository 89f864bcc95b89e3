package llm

import (
	"context"
	"errors"
	"net/http"
	"strconv"
)

// The timeouts of a provider call (docs/TIMEOUTS.md). Each is wrapped in a
// Retryable *Error.
var (
	// ErrFirstTokenTimeout is wrapped by a call that produced no chunk
	// within OpenAIConfig.FirstTokenTimeout (LLM_FIRST_TOKEN_TIMEOUT_SECONDS),
	// and by a call cut by OpenAIConfig.Timeout before its first chunk.
	// Nothing reached the client, so a retry is safe; it counts against
	// the circuit breaker, as the upstream is too slow to start answering.
	ErrFirstTokenTimeout = errors.New("llm: no first chunk within the first-token timeout")
	// ErrIdleTimeout is wrapped by a call whose upstream fell silent for
	// OpenAIConfig.IdleTimeout (LLM_IDLE_TIMEOUT_SECONDS) after its first
	// chunk. The caller ends the answer with an error event when chunks
	// reached the client. It does not count against the circuit breaker:
	// one stalled answer says little about the upstream's health.
	ErrIdleTimeout = errors.New("llm: upstream silent for longer than the idle timeout")
	// ErrTotalTimeout is wrapped by a call cut by OpenAIConfig.Timeout
	// (LLM_TIMEOUT_SECONDS, off by default) after its first chunk. Like
	// ErrIdleTimeout it does not count against the circuit breaker: the
	// upstream was answering, only for too long.
	ErrTotalTimeout = errors.New("llm: answer exceeded the call timeout")
	// ErrNoCapacity is wrapped by a provider that cannot take the call
	// right now and sent nothing: every upstream at its cap, sitting out or
	// out of quota (internal/llm/upstream). It is retryable (the api hands the
	// request to the queue, a worker waits) and never the upstream's fault,
	// so it does not count against the circuit breaker.
	ErrNoCapacity = errors.New("llm: no upstream capacity now")
	// ErrCircuitOpen is wrapped by a call a circuit breaker refused
	// without making it (internal/llm/breaker): the provider's circuit is
	// open, or half-open with its trial calls taken, or, with several
	// upstreams, every upstream that could take the call has its circuit
	// open. It comes inside a retryable *Error whose RetryAfter is the
	// time left open. IsCircuitOpen recognises it.
	ErrCircuitOpen = errors.New("llm: provider circuit open")
)

// IsCircuitOpen reports whether err is a circuit breaker's refusal
// (ErrCircuitOpen): no call was made, so it is no failure of the
// provider's, and a retry waits for the circuit rather than spending a
// retry.
func IsCircuitOpen(err error) bool { return errors.Is(err, ErrCircuitOpen) }

// Reasons name why a provider call failed, as the reason label of
// spillway_worker_retries_total{reason}. Reason returns one of them; the
// set is closed so that the label's cardinality stays small.
const (
	// ReasonTimeout: ErrFirstTokenTimeout, ErrIdleTimeout or ErrTotalTimeout.
	ReasonTimeout = "timeout"
	// ReasonThrottled: the upstream answered 429 or 503 (overloaded, often
	// with Retry-After).
	ReasonThrottled = "throttled"
	// ReasonServerError: another 5xx, or an error event inside the stream.
	ReasonServerError = "server_error"
	// ReasonConnection: no usable response: a refused or reset connection,
	// a stream cut before its end.
	ReasonConnection = "connection"
	// ReasonClientError: the upstream refused this request's content
	// (IsClientError).
	ReasonClientError = "client_error"
	// ReasonRejected: another 4xx, such as 401 or 403 for a wrong key.
	ReasonRejected = "rejected"
	// ReasonBadResponse: the upstream's answer could not be read (not an
	// event stream, a malformed event).
	ReasonBadResponse = "bad_response"
	// ReasonCancelled: the caller's context ended.
	ReasonCancelled = "cancelled"
	// ReasonOther: any other error, such as one returned by emit.
	ReasonOther = "other"
)

// Reason returns the reason label of err, one of the Reason* constants,
// or "" for nil.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	if isTimeout(err) {
		return ReasonTimeout
	}
	if errors.Is(err, ErrNoCapacity) {
		return ReasonThrottled
	}
	var e *Error
	switch {
	case errors.As(err, &e):
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return ReasonCancelled
	default:
		return ReasonOther
	}
	switch {
	case e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable:
		return ReasonThrottled
	case e.Status >= 500:
		return ReasonServerError
	case IsClientError(err):
		return ReasonClientError
	case e.Status >= 400:
		return ReasonRejected
	case !e.Retryable:
		return ReasonBadResponse
	case errors.Is(err, errStreamErrorEvent):
		return ReasonServerError
	}
	return ReasonConnection
}

// ResponseCode returns the label of spillway_upstream_responses_total{code}
// for the outcome of one provider call: "200" for a success, the upstream
// HTTP status of a failed one (also "200" when the failure came in the
// middle of a stream), and ok false when no response arrived, which that
// metric does not count.
func ResponseCode(err error) (code string, ok bool) {
	if err == nil {
		return "200", true
	}
	var e *Error
	if !errors.As(err, &e) || e.Status == 0 {
		return "", false
	}
	return strconv.Itoa(e.Status), true
}

// IsClientError reports whether err is an upstream refusal of this
// request's content, which another request would not meet: 400, 404 (an
// unknown model), 413, 415 or 422. Such a failure is never retried and
// never dead-lettered: the client is told at once. 401 and 403 are not
// client errors here: a wrong key fails every call.
func IsClientError(err error) bool {
	var e *Error
	if !errors.As(err, &e) || e.Retryable {
		return false
	}
	switch e.Status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// CountsAgainstBreaker reports whether err says the provider is unhealthy,
// so that the circuit breaker counts it as a failure. Refused connections,
// streams cut short, 5xx, 401/403 and ErrFirstTokenTimeout count. These do
// not: nil, the caller's cancellation, errors that are not provider
// failures (no *Error in the chain, such as emit's), client errors
// (IsClientError), 429 (the upstream is busy, not broken: Retry-After
// handles it) and timeouts after the first chunk (ErrIdleTimeout,
// ErrTotalTimeout: long or stalled answers must not open the circuit for
// everyone).
func CountsAgainstBreaker(err error) bool {
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, ErrFirstTokenTimeout):
		return true
	case errors.Is(err, ErrIdleTimeout), errors.Is(err, ErrTotalTimeout):
		return false
	}
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Status != http.StatusTooManyRequests && !IsClientError(err)
}

func isTimeout(err error) bool {
	return errors.Is(err, ErrFirstTokenTimeout) || errors.Is(err, ErrIdleTimeout) || errors.Is(err, ErrTotalTimeout)
}

// errStreamErrorEvent is wrapped by an error event inside an upstream
// stream, which OpenAI documents as an overload or server fault.
var errStreamErrorEvent = errors.New("upstream error event")
