package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// ProblemType is one entry of the problem catalogue: the slug of its
// `type` URI, and the title and HTTP status every occurrence carries
// (RFC 9457: the title of a type does not change between occurrences).
type ProblemType struct {
	Slug   string
	Title  string
	Status int
	// Type is ProblemTypeBase + Slug, built once by the catalogue so an
	// occurrence costs one allocation.
	Type string
}

// New returns an occurrence of t with detail, written for the client.
func (t ProblemType) New(detail string) *Problem {
	return &Problem{Type: t.Type, Title: t.Title, Status: t.Status, Detail: detail}
}

// pt is one catalogue entry.
func pt(slug, title string, status int) ProblemType {
	return ProblemType{Slug: slug, Title: title, Status: status}
}

// catalogue indexes types by slug and fills in their Type.
func catalogue(types ...ProblemType) map[string]ProblemType {
	m := make(map[string]ProblemType, len(types))
	for _, t := range types {
		t.Type = ProblemTypeBase + t.Slug
		m[t.Slug] = t
	}
	return m
}

// Problems is the catalogue: every problem type Spillway writes, on a
// refusal (application/problem+json) or in an `error` event. No component
// builds a problem of a type missing here; TestProblemCatalogue holds that
// every slug constant has an entry. docs/API.md lists them for clients.
var Problems = catalogue(
	pt(ProblemBadRequest, "Bad Request", http.StatusBadRequest),
	pt(ProblemUnauthorized, "Unauthorized", http.StatusUnauthorized),
	pt(ProblemNotFound, "Not Found", http.StatusNotFound),
	pt(ProblemMethodNotAllowed, "Method Not Allowed", http.StatusMethodNotAllowed),
	pt(ProblemBodyTooLarge, "Request Body Too Large", http.StatusRequestEntityTooLarge),
	pt(ProblemUnsupportedMedia, "Unsupported Media Type", http.StatusUnsupportedMediaType),
	pt(ProblemRateLimited, "Too Many Requests", http.StatusTooManyRequests),
	pt(ProblemPoolExhausted, "Capacity Exhausted", http.StatusServiceUnavailable),
	pt(ProblemQueueOverflow, "Queue Over Capacity", http.StatusServiceUnavailable),
	pt(ProblemQueueTimeout, "Queue Timeout", http.StatusServiceUnavailable),
	pt(ProblemQueueUnavailable, "Queue Unavailable", http.StatusServiceUnavailable),
	pt(ProblemProviderError, "Provider Error", http.StatusBadGateway),
	pt(ProblemProviderUnavailable, "Provider Unavailable", http.StatusServiceUnavailable),
	pt(ProblemProviderRejected, "Provider Rejected the Request", http.StatusUnprocessableEntity),
	pt(ProblemWorkerLost, "Worker Lost", http.StatusServiceUnavailable),
	pt(ProblemStreamGap, "Stream Gap", http.StatusServiceUnavailable),
	pt(ProblemShuttingDown, "Shutting Down", http.StatusServiceUnavailable),
	pt(ProblemSlowClient, "Client Too Slow", http.StatusServiceUnavailable),
	pt(ProblemNotReady, "Not Ready", http.StatusServiceUnavailable),
	pt(ProblemInternal, "Internal Error", http.StatusInternalServerError),
	pt(ProblemStopped, "Stopped", http.StatusGone),
	pt(ProblemStreamExpired, "Stream Expired", http.StatusGone),
	pt(ProblemTooManyQueued, "Too Many Queued Requests", http.StatusTooManyRequests),
	pt(ProblemRequestTimeout, "Request Timeout", http.StatusRequestTimeout),
	pt(ProblemHeadersTooLarge, "Request Header Fields Too Large", http.StatusRequestHeaderFieldsTooLarge),
	pt(ProblemTooManyConnections, "Too Many Connections", http.StatusServiceUnavailable),
	pt(ProblemBodiesInFlight, "Request Bodies Over Capacity", http.StatusServiceUnavailable),
)

// problem returns an occurrence of the catalogued type slug advising a
// retry after retryAfterSeconds, in one allocation (refusals are a hot
// path under overload).
func problem(slug, detail string, retryAfterSeconds int) *Problem {
	t := Problems[slug]
	return &Problem{Type: t.Type, Title: t.Title, Status: t.Status, Detail: detail,
		RetryAfterSeconds: retryAfterSeconds}
}

// Each function below returns a fresh occurrence the caller may change;
// retryAfterSeconds 0 advises no retry delay.

// BadRequest refuses a request that could not be read or decoded; detail
// is client text (protocol's decode errors are written for the client).
func BadRequest(detail string) *Problem { return problem(ProblemBadRequest, detail, 0) }

// Unauthorized refuses a request without a valid API key.
func Unauthorized(detail string) *Problem { return problem(ProblemUnauthorized, detail, 0) }

// NotFound answers a path no route serves.
func NotFound() *Problem { return problem(ProblemNotFound, "No such endpoint.", 0) }

// MethodNotAllowed answers a known path asked with another method.
func MethodNotAllowed(method string) *Problem {
	return problem(ProblemMethodNotAllowed, "This endpoint does not take "+method+".", 0)
}

// BodyTooLarge refuses a body over MAX_BODY_BYTES.
func BodyTooLarge(limit int64) *Problem {
	return problem(ProblemBodyTooLarge, fmt.Sprintf("The request body must be at most %d bytes.", limit), 0)
}

// TooLargeToQueue refuses a request whose job does not fit a queue
// message of at most limit bytes: no retry will make it fit.
func TooLargeToQueue(limit int) *Problem {
	return problem(ProblemBodyTooLarge, fmt.Sprintf("The request is too large to be queued: as a queued job it exceeds "+
		"the queue's limit of %d bytes. Shorten it; sending it again unchanged will not succeed.", limit), 0)
}

// UnsupportedMedia refuses a body that is not application/json.
func UnsupportedMedia() *Problem {
	return problem(ProblemUnsupportedMedia, "Content-Type must be application/json.", 0)
}

// RateLimited refuses an identity over RATE_LIMIT_RPS.
func RateLimited(retryAfterSeconds int) *Problem {
	return problem(ProblemRateLimited, "This client sent too many requests; retry after the advised delay.", retryAfterSeconds)
}

// PoolExhausted refuses a request when no slot is free and no queue takes it.
func PoolExhausted(retryAfterSeconds int) *Problem {
	return problem(ProblemPoolExhausted, "No streaming slot is free for this request; retry shortly.", retryAfterSeconds)
}

// QueueOverflow refuses a request while the backlog is over
// QUEUE_OVERFLOW_THRESHOLD.
func QueueOverflow(retryAfterSeconds int) *Problem {
	return problem(ProblemQueueOverflow, "Too many requests are waiting; retry after the advised delay.", retryAfterSeconds)
}

// QueueTimeout ends a queued request no worker started in time.
func QueueTimeout(retryAfterSeconds int) *Problem {
	return problem(ProblemQueueTimeout, "No worker started the request in time; retry shortly.", retryAfterSeconds)
}

// QueueUnavailable is the refusal when a job could not be queued.
func QueueUnavailable(retryAfterSeconds int) *Problem {
	return problem(ProblemQueueUnavailable, "The request could not be queued; retry shortly.", retryAfterSeconds)
}

// ResultChannelLost ends a queued request whose result subscription broke.
func ResultChannelLost(retryAfterSeconds int) *Problem {
	return problem(ProblemQueueUnavailable, "The connection carrying the answer was lost; retry the request.", retryAfterSeconds)
}

// ProviderFailed ends a stream whose provider call failed, on either path.
func ProviderFailed(retryAfterSeconds int) *Problem {
	return problem(ProblemProviderError, "The model provider failed while answering; retry the request.", retryAfterSeconds)
}

// ProviderUnavailable refuses or ends a request while the provider's
// circuit is open.
func ProviderUnavailable(retryAfterSeconds int) *Problem {
	return problem(ProblemProviderUnavailable, "The model provider is failing; requests are refused until it recovers. Retry after the advised delay.",
		retryAfterSeconds)
}

// ProviderRejected ends a stream whose provider refused this request's
// content (upstream 400, 404, 413, 415 or 422; llm.IsClientError): sending
// it again would meet the same answer, so it advises no retry and is never
// retried or dead-lettered. The problem has the upstream's status, and
// carries the upstream's error body (upstreamBody, when it is a JSON
// object) whole, so an OpenAI-dialect client gets the upstream's error as
// the upstream sent it (docs/API.md, "Upstream client errors are the client's").
func ProviderRejected(upstreamStatus int, upstreamBody []byte) *Problem {
	p := problem(ProblemProviderRejected, fmt.Sprintf(
		"The model provider refused this request (HTTP %d): check the model name, the messages and the parameters; sending it again unchanged will not help.",
		upstreamStatus), 0)
	if upstreamStatus >= 400 && upstreamStatus < 500 {
		p.Status = upstreamStatus
	}
	body := bytes.TrimSpace(upstreamBody)
	if len(body) > 0 && body[0] == '{' && json.Valid(body) {
		p.UpstreamError = json.RawMessage(body)
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &e) == nil {
			if m := cmpOr(e.Error.Message, e.Message); m != "" {
				p.Detail = fmt.Sprintf("The model provider refused this request (HTTP %d): %s", upstreamStatus, m)
			}
		}
	}
	return p
}

// WorkerLost ends a queued request whose worker went silent and no other
// took over.
func WorkerLost(retryAfterSeconds int) *Problem {
	return problem(ProblemWorkerLost, "The worker answering the request stopped and no other took over; retry the request.",
		retryAfterSeconds)
}

// StreamGap ends a queued stream in which chunks went missing and were not
// made good in time: the client has part of an answer, never a `done`.
func StreamGap(retryAfterSeconds int) *Problem {
	return problem(ProblemStreamGap, "Part of the answer was lost on the way from the worker; retry the request.",
		retryAfterSeconds)
}

// SlowClient ends a stream whose client did not read fast enough.
func SlowClient(retryAfterSeconds int) *Problem {
	return problem(ProblemSlowClient, "The stream was ended because the client did not read it fast enough.", retryAfterSeconds)
}

// ShuttingDown ends a stream still open when the shutdown grace is over.
func ShuttingDown(retryAfterSeconds int) *Problem {
	return problem(ProblemShuttingDown, "The server is restarting; retry the request.", retryAfterSeconds)
}

// NotReady answers /readyz while a dependency is unreachable.
func NotReady(retryAfterSeconds int) *Problem {
	return problem(ProblemNotReady, "A dependency is unreachable.", retryAfterSeconds)
}

// StreamFailed ends a stream that failed unexpectedly (a bug).
func StreamFailed() *Problem {
	return problem(ProblemInternal, "The stream failed unexpectedly; retry the request.", 0)
}

// RequestFailed answers a request whose handler panicked (a bug).
func RequestFailed() *Problem {
	return problem(ProblemInternal, "The request failed unexpectedly; retry it.", 0)
}

// Stopped ends a stream its owner stopped (DELETE /v1/streams/{id}), or
// one nobody came back to within STREAM_RESUME_WINDOW_SECONDS. Its status
// is 410: the answer will not come.
func Stopped(detail string) *Problem {
	return problem(ProblemStopped, detail, 0)
}

// StreamExpired ends a resumed stream whose log stopped growing or
// expired before a terminal event: its producer is gone.
func StreamExpired() *Problem {
	return problem(ProblemStreamExpired, "The answer's producer is gone before it finished; send the request again.", 0)
}

// TooManyQueued refuses a request whose identity already has
// QUEUE_MAX_PER_IDENTITY jobs waiting.
func TooManyQueued(retryAfterSeconds int) *Problem {
	return problem(ProblemTooManyQueued, "This client already has the most requests allowed waiting in the queue; retry after the advised delay.",
		retryAfterSeconds)
}

// RequestTimeout refuses a request whose body did not arrive within
// BODY_READ_TIMEOUT_SECONDS.
func RequestTimeout() *Problem {
	return problem(ProblemRequestTimeout, "The request body did not arrive in time.", 0)
}

// HeadersTooLarge refuses a request whose header block is over the limit.
func HeadersTooLarge(limit int) *Problem {
	return problem(ProblemHeadersTooLarge, fmt.Sprintf("The request headers must be at most %d bytes.", limit), 0)
}

// TooManyConnections refuses a connection over MAX_CONNECTIONS.
func TooManyConnections(retryAfterSeconds int) *Problem {
	return problem(ProblemTooManyConnections, "The server has too many open connections; retry shortly.", retryAfterSeconds)
}

// BodiesInFlight refuses a request whose body would take the bytes the
// api reads or holds at once over BODY_BYTES_IN_FLIGHT.
func BodiesInFlight(retryAfterSeconds int) *Problem {
	return problem(ProblemBodiesInFlight, "The server holds too many request bodies at once; retry shortly.", retryAfterSeconds)
}

// ModelNotAllowed refuses a model outside LLM_MODELS.
func ModelNotAllowed() *Problem {
	return problem(ProblemBadRequest, "This model is not offered here; ask for one of the configured models.", 0)
}
