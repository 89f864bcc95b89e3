// Package admission owns the admission checks that refuse work explicitly,
// with a problem document and a Retry-After, before it piles up: the queue
// overflow gate, the per-identity rate limiter, the refusal while the
// provider's circuit is open (the breaker itself is the provider's,
// internal/llm/breaker), and the Retry-After estimates they and the pool
// refusals share.
//
// The checks on the request path (Overflow.Check, the circuit's OpenFor,
// RateLimiter.Allow with the limiter off) read only in-process state, so
// they cost nanoseconds; the queue depth is refreshed in the background by
// Overflow.Run, never per request. Every refusal is a *protocol.Problem
// written for the client; clients should spread their retries by adding
// about ±20% jitter to the advised Retry-After.
package admission
