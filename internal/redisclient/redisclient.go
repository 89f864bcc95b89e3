// Package redisclient owns the connection settings every Redis client of
// a process shares (REDIS_POOL_SIZE, REDIS_MIN_IDLE_CONNS and the
// REDIS_*_TIMEOUT_MS timeouts): their defaults and their ranges.
// internal/app builds the clients with them (docs/OPERATIONS.md, "Redis
// busy or down").
package redisclient

import (
	"errors"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
)

// Defaults of the timeouts.
const (
	// DefaultDialTimeout bounds opening a connection. go-redis's own is
	// 5 s; a Redis that takes a second to accept is better treated as
	// down (the pool falls back).
	DefaultDialTimeout = time.Second
	// DefaultTimeout bounds one read or write on a connection.
	DefaultTimeout = 3 * time.Second
	// DefaultPoolTimeout bounds the wait for a free connection when all
	// are busy.
	DefaultPoolTimeout = time.Second
)

// MinTimeout is the shortest timeout Validate accepts: below it a
// command on a healthy Redis could time out.
const MinTimeout = 10 * time.Millisecond

// Options are the connection settings of a process's Redis clients.
type Options struct {
	// PoolSize is the connections per Redis node (REDIS_POOL_SIZE); 0
	// lets the process size it.
	PoolSize int
	// MinIdleConns are kept open per node (REDIS_MIN_IDLE_CONNS).
	MinIdleConns int
	// DialTimeout bounds opening a connection (REDIS_DIAL_TIMEOUT_MS).
	DialTimeout time.Duration
	// Timeout bounds one read or write (REDIS_TIMEOUT_MS).
	Timeout time.Duration
	// PoolTimeout bounds the wait for a free connection
	// (REDIS_POOL_TIMEOUT_MS).
	PoolTimeout time.Duration
}

// Validate reports each field out of range as a *bounds.Error, joined. It
// does not change o.
func (o Options) Validate() error {
	return errors.Join(
		bounds.AtLeast("PoolSize", o.PoolSize, 0),
		bounds.AtLeast("MinIdleConns", o.MinIdleConns, 0),
		bounds.AtLeast("DialTimeout", o.DialTimeout, MinTimeout),
		bounds.AtLeast("Timeout", o.Timeout, MinTimeout),
		bounds.AtLeast("PoolTimeout", o.PoolTimeout, MinTimeout),
	)
}
