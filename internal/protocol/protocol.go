// Package protocol owns the wire formats between the api and the workers: the
// request body, the job message, the result-channel messages and the SSE
// event payloads. It is pure: no I/O, no clocks, no globals that change.
package protocol

import (
	"encoding/json"
	"time"
)

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatRequest is a validated request: the body of POST /v1/stream or
// /v1/chat/completions after its decoder, and the payload of a queued Job.
// Body is what travels: the request as the client sent it, byte for byte,
// with only what Spillway owns changed (docs/API.md, "What passes
// untouched"); the other fields are what Spillway reads of it.
type ChatRequest struct {
	// Messages is the text view of the messages: their roles, and text
	// parts joined by line breaks. The simulator answers from it and the
	// token estimates count it. Every other part of a message travels in
	// Body only.
	Messages    []Message `json:"messages,omitempty"`
	Model       string    `json:"model,omitempty"`
	MaxTokens   int       `json:"max_tokens,omitempty"`
	Temperature *float64  `json:"temperature,omitempty"`
	ThreadID    string    `json:"thread_id,omitempty"`

	// Body is the request as it is forwarded (UpstreamBody adds the
	// streaming fields). Nil for a request built in code, whose provider
	// call is built from the fields above.
	Body []byte `json:"-"`
	// Route is where the request came in (RouteStream, RouteChat).
	Route string `json:"-"`
	// TokensField is the field the client capped the answer with,
	// max_tokens or max_completion_tokens; empty when neither.
	TokensField string `json:"-"`
	// N is how many choices the client asked for (n), at least 1.
	N int `json:"-"`
	// Stream is the client's `stream`: on the OpenAI routes, chunks
	// rather than one object.
	Stream bool `json:"-"`
	// IncludeUsage is the client's stream_options.include_usage: the
	// upstream is always asked for usage, the client gets its chunk only
	// when it asked.
	IncludeUsage bool `json:"-"`
	// Tools names the tools offered, in order (the simulator calls the
	// first).
	Tools []string `json:"-"`
	// ReasoningEffort is the client's reasoning_effort, if any.
	ReasoningEffort string `json:"-"`
	// TextBytes counts the bytes of the text in the messages, and
	// NonTextParts the content parts that are not text (images, audio,
	// files): token estimates count the first by bytes/4 and each of the
	// second as NONTEXT_PART_TOKENS, never their base64 bytes.
	TextBytes    int `json:"-"`
	NonTextParts int `json:"-"`
}

// Usage counts tokens of one answer, in the OpenAI shape, with the
// upstream's details passed on as it sent them.
type Usage struct {
	PromptTokens            int     `json:"prompt_tokens"`
	CompletionTokens        int     `json:"completion_tokens"`
	TotalTokens             int     `json:"total_tokens"`
	PromptTokensDetails     RawJSON `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails RawJSON `json:"completion_tokens_details,omitempty"`
}

// RawJSON is a JSON value kept as it came. It is a string, so the structs
// that hold one stay comparable; empty means absent (or null).
type RawJSON string

// MarshalJSON returns the value as it came.
func (r RawJSON) MarshalJSON() ([]byte, error) {
	if r == "" {
		return []byte("null"), nil
	}
	return []byte(r), nil
}

// UnmarshalJSON keeps b; null is kept as empty.
func (r *RawJSON) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*r = ""
		return nil
	}
	*r = RawJSON(b)
	return nil
}

// Chunk is one piece of an answer with its sequence number, counted from 1
// within one attempt.
type Chunk struct {
	Seq int `json:"seq"`
	// Content is the text of choices[0].delta.content.
	Content string `json:"content"`
	// Raw is the upstream's chunk as it came (a chat.completion.chunk),
	// when it must travel whole: always for an OpenAI-dialect client,
	// and for any client when the chunk carries more than Content
	// (Extra). Nil for a chunk of plain content on /v1/stream, and for a
	// provider that makes its own chunks (the simulator's plain text).
	Raw json.RawMessage `json:"raw,omitempty"`
	// Extra reports that Raw carries deltas a /v1/stream event shows
	// besides Content: another choice, reasoning, tool calls, a refusal,
	// audio or logprobs. It does not travel: a receiver that finds Raw
	// reads it.
	Extra bool `json:"-"`
}

// Output reports whether c carries model output: content or extra
// deltas. A role-only preamble, a finish reason or usage alone is none:
// the first chunk, for time to first chunk and for whether a retry is
// still invisible to the client, is the first with output.
func (c Chunk) Output() bool { return c.Content != "" || c.Extra }

// NeededBy reports whether a client on route gets chunk c: an
// OpenAI-dialect client every chunk the upstream sent (its role preamble,
// its finish and usage chunks included), a /v1/stream client only a chunk
// with content or extra deltas (its done event carries the finish reason
// and the usage).
func (c Chunk) NeededBy(route string) bool {
	return !Native(route) || c.Content != "" || c.Extra
}

// Native reports whether route writes /v1/stream's events: RouteStream,
// or none (a version 1 job's, a request built in code).
func Native(route string) bool { return route == RouteStream || route == "" }

// For returns c as it travels to a client on route: a /v1/stream client
// gets Raw only with extra deltas.
func (c Chunk) For(route string) Chunk {
	if Native(route) && !c.Extra {
		c.Raw = nil
	}
	return c
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
const JobVersion = 2

// Job is a queued request as it travels through Redis Streams or Kafka.
type Job struct {
	Version   int    `json:"v"`
	RequestID string `json:"request_id"`
	UserID    string `json:"user_id"`
	ThreadID  string `json:"thread_id,omitempty"`
	// SessionID is the request's X-Session-ID, the affinity key of
	// several upstreams (docs/UPSTREAMS.md, "Routing"). Optional.
	SessionID string `json:"session_id,omitempty"`
	// Payload is the request. A version 2 job carries its Body and Route
	// in Body and Route below, and DecodeJob reads Payload from them; a
	// version 1 job (written before the transparent proxy) carries the
	// text view here.
	Payload ChatRequest `json:"payload,omitzero"`
	// Route is the request's route (RouteStream, RouteChat); version 2.
	Route string `json:"route,omitempty"`
	// Body is the request body as the api forwards it, byte for byte;
	// version 2. EncodeJob writes Payload.Body here.
	Body json.RawMessage `json:"body,omitempty"`
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
