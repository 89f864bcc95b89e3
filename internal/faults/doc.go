// Package faults owns the fault-injection suite of the queued path
// (docs/RELIABILITY.md): a real redis-server, toxiproxy embedded as a
// library between a worker and Redis, and the real gateway, worker, queue
// and result channel. It holds tests only; `make faults` runs them, and
// `make test` runs them with the same short settings.
package faults
