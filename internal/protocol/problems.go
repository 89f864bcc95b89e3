package protocol

import "net/http"

// Problems more than one component sends. Each call returns a fresh copy
// the caller may change.

// QueueUnavailable is the refusal when a job could not be queued.
func QueueUnavailable(retryAfterSeconds int) *Problem {
	return NewProblem(ProblemQueueUnavailable, "Queue Unavailable", http.StatusServiceUnavailable,
		"The request could not be queued; retry shortly.").WithRetryAfter(retryAfterSeconds)
}

// ProviderFailed ends a stream whose provider call failed, on either path.
func ProviderFailed(retryAfterSeconds int) *Problem {
	return NewProblem(ProblemProviderError, "Provider Error", http.StatusBadGateway,
		"The model provider failed while answering; retry the request.").WithRetryAfter(retryAfterSeconds)
}

// ProviderUnavailable refuses or ends a request while the provider's
// circuit is open.
func ProviderUnavailable(retryAfterSeconds int) *Problem {
	return NewProblem(ProblemProviderUnavailable, "Provider Unavailable", http.StatusServiceUnavailable,
		"The model provider is failing; requests are refused until it recovers. Retry after the advised delay.").WithRetryAfter(retryAfterSeconds)
}
