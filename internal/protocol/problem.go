package protocol

import (
	"encoding/json"
	"fmt"
	"time"
)

// ProblemTypeBase prefixes every problem `type` URI Spillway writes.
const ProblemTypeBase = "https://spillway.dev/errors/"

// Problem type slugs. The full `type` is ProblemTypeBase + slug.
const (
	ProblemBadRequest          = "bad-request"
	ProblemUnauthorized        = "unauthorized"
	ProblemNotFound            = "not-found"
	ProblemMethodNotAllowed    = "method-not-allowed"
	ProblemBodyTooLarge        = "body-too-large"
	ProblemUnsupportedMedia    = "unsupported-media-type"
	ProblemRateLimited         = "rate-limited"
	ProblemPoolExhausted       = "pool-exhausted"
	ProblemQueueOverflow       = "queue-overflow"
	ProblemQueueTimeout        = "queue-timeout"
	ProblemQueueUnavailable    = "queue-unavailable"
	ProblemProviderError       = "provider-error"
	ProblemProviderUnavailable = "provider-unavailable"
	ProblemProviderRejected    = "provider-rejected"
	ProblemWorkerLost          = "worker-lost"
	ProblemStreamGap           = "stream-gap"
	ProblemShuttingDown        = "shutting-down"
	ProblemSlowClient          = "slow-client"
	ProblemNotReady            = "not-ready"
	ProblemInternal            = "internal"
	ProblemStopped             = "stopped"
	ProblemStreamExpired       = "stream-expired"
	ProblemTooManyQueued       = "too-many-queued"
	ProblemRequestTimeout      = "request-timeout"
	ProblemHeadersTooLarge     = "headers-too-large"
	ProblemTooManyConnections  = "too-many-connections"
	ProblemBodiesInFlight      = "bodies-in-flight"
)

// Problem is an RFC 9457 problem document. It is what a refused request
// gets as application/problem+json and what an `error` SSE event carries.
// Detail is written for the client on purpose; internal error text never
// goes into it.
type Problem struct {
	Type              string `json:"type"`
	Title             string `json:"title"`
	Status            int    `json:"status"`
	Detail            string `json:"detail,omitempty"`
	Instance          string `json:"instance,omitempty"`
	RetryAfterSeconds int    `json:"retry_after_seconds,omitempty"`
	// UpstreamError is the upstream's own error object when it refused
	// the request (provider-rejected): what an OpenAI-dialect client gets
	// as it was sent, and a problem document carries as an extension
	// member.
	UpstreamError json.RawMessage `json:"upstream_error,omitempty"`
}

// Error makes *Problem usable as an error that carries its own client text.
func (p *Problem) Error() string {
	return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail)
}

// RetryAfterSeconds is the one meaning of Retry-After, the header and the
// problem's retry_after_seconds alike: d rounded up to whole seconds, at
// least 1. Rounding down would bring the client back before the advised
// moment, to another refusal; 0 would mean "at once".
func RetryAfterSeconds(d time.Duration) int {
	if d <= time.Second {
		return 1
	}
	return int((d + time.Second - 1) / time.Second)
}

// WithRetryAfter returns a copy of p advising a retry after secs seconds.
func (p *Problem) WithRetryAfter(secs int) *Problem {
	c := *p
	c.RetryAfterSeconds = secs
	return &c
}

// Slug returns the last part of the problem type ("queue-timeout").
func (p *Problem) Slug() string {
	if len(p.Type) > len(ProblemTypeBase) && p.Type[:len(ProblemTypeBase)] == ProblemTypeBase {
		return p.Type[len(ProblemTypeBase):]
	}
	return p.Type
}
