// Package protocol owns the wire formats between the api and the workers: the
// request body, the job message, the result-channel messages and the SSE
// event payloads. It is pure: no I/O, no clocks, no globals that change.
package protocol

import (
	"time"
)

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatRequest is a validated streaming request: the body of POST /v1/stream
// after DecodeChatRequest, and the payload of a queued Job.
type ChatRequest struct {
	Messages    []Message `json:"messages"`
	Model       string    `json:"model,omitempty"`
	MaxTokens   int       `json:"max_tokens,omitempty"`
	Temperature *float64  `json:"temperature,omitempty"`
	ThreadID    string    `json:"thread_id,omitempty"`
}

// Usage counts tokens of one answer, in the OpenAI shape.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Chunk is one piece of an answer with its sequence number, counted from 1
// within one attempt.
type Chunk struct {
	Seq     int    `json:"seq"`
	Content string `json:"content"`
}

// Path values: which way a request was answered, sent in the `done`
// event's path and the X-Stream-Path header (docs/API.md). Metrics label
// streams with the same values.
const (
	// PathDirect is a stream answered in the api process holding a pool slot.
	PathDirect = "direct"
	// PathQueued is a stream answered by a worker through the queue.
	PathQueued = "queued"
)

// Done is the payload of the terminal SSE `done` event and of SIGNAL:DONE.
type Done struct {
	RequestID    string `json:"request_id,omitempty"`
	FinishReason string `json:"finish_reason,omitempty"`
	// Path is PathDirect or PathQueued.
	Path  string `json:"path,omitempty"`
	Usage *Usage `json:"usage,omitempty"`
}

// Reset is the payload of the SSE `reset` event and of SIGNAL:RESET: the
// chunks so far are void and attempt Attempt starts again at sequence 1.
type Reset struct {
	Attempt int `json:"attempt"`
}

// MaxRetryInSeconds bounds Retrying.RetryInSeconds: no backoff Spillway
// waits is longer than an hour (LLM_RETRY_AFTER_MAX_SECONDS caps an
// upstream's Retry-After), so a larger value is a corrupt message.
const MaxRetryInSeconds = 3600

// Retrying is the payload of the SSE `retrying` event and of
// SIGNAL:RETRYING: the provider call failed before any chunk reached the
// client, and attempt Attempt starts after RetryInSeconds (docs/API.md).
// Clients that do not know the event ignore it.
type Retrying struct {
	// Attempt is the retry about to be made, from 1.
	Attempt int `json:"attempt"`
	// RetryInSeconds is the wait before it, in seconds (fractions for
	// sub-second backoffs).
	RetryInSeconds float64 `json:"retry_in_seconds"`
	// Reason is why the last call failed: a label of
	// spillway_worker_retries_total{reason} (timeout, throttled,
	// server_error, connection, circuit_open, …).
	Reason string `json:"reason"`
}

// JobVersion is the version of the Job wire format this package writes.
const JobVersion = 1

// Job is a queued request as it travels through Redis Streams or Kafka.
type Job struct {
	Version   int    `json:"v"`
	RequestID string `json:"request_id"`
	UserID    string `json:"user_id"`
	ThreadID  string `json:"thread_id,omitempty"`
	// SessionID is the request's X-Session-ID, the affinity key of
	// several upstreams (docs/UPSTREAMS.md, "Routing"). Optional.
	SessionID string      `json:"session_id,omitempty"`
	Payload   ChatRequest `json:"payload"`
	// EnqueueTime is when the api accepted the job.
	EnqueueTime time.Time `json:"enqueue_time"`
	// Deadline is the latest time a worker may start the job; after it the
	// client has been told queue-timeout and the job is skipped.
	Deadline time.Time `json:"deadline"`
	// Trace is the W3C trace context of the api's enqueue span, so the
	// worker's spans join the request's trace (docs/TRACING.md). Optional:
	// jobs written before it existed, or with tracing off, have none.
	Trace *TraceContext `json:"trace,omitempty"`
	// TraceDropped is set by DecodeJob when the job carried a trace field it
	// could not accept and dropped; the job itself is fine. It is not part
	// of the wire format: it tells the consumer to count the bad field.
	TraceDropped bool `json:"-"`
	// Priority is the request's effective priority, after the caller's
	// maximum lowered it (docs/API.md, "Priority"), so workers and their
	// logs see it. Optional: a job without one is normal.
	Priority Priority `json:"priority,omitempty"`
	// ReplayOf is the dead letter `spillway-admin replay` re-enqueued this
	// job from: if the replay fails too, its dead letter replaces that one
	// instead of adding a second for the same prompt (docs/OPERATIONS.md,
	// "Dead letters: spillway-admin"). Optional.
	ReplayOf string `json:"replay_of,omitempty"`
}
