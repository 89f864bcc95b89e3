// Package breaker owns the provider's circuit breakers: a Breaker around
// one provider (or one upstream), which fails fast while the provider is
// unhealthy, and Circuits, the breakers of several upstreams seen as one.
// A refusal wraps llm.ErrCircuitOpen (llm.IsCircuitOpen recognises it);
// OpenFor tells the api's admission gate how long to refuse.
package breaker
