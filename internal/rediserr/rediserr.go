// Package rediserr sorts the errors of go-redis calls into what they say
// about Redis: nothing (a reply to this call, such as a script's error),
// busy (no answer in time: a fork for a snapshot, an fsync, a slow script,
// a starved CPU) or gone (a refused or reset connection, or a server that
// cannot serve at all). Components fall back to local limits only when
// Redis is gone, never because one call was slow (docs/OPERATIONS.md,
// "Redis busy or down").
package rediserr

import (
	"context"
	"errors"
	"net"

	"github.com/redis/go-redis/v9"
)

// State is what an error says about Redis.
type State int

const (
	// Fine: Redis answered; the error is the call's own.
	Fine State = iota
	// Busy: Redis did not answer in time, or asked to try again.
	Busy
	// Gone: the connection is refused, reset or closed, or the server
	// cannot serve (loading, no primary, read-only replica, out of memory,
	// out of clients).
	Gone
)

func (s State) String() string {
	switch s {
	case Busy:
		return "busy"
	case Gone:
		return "gone"
	}
	return "fine"
}

// Classify sorts err, an error of a go-redis call that its caller did not
// cause by giving up itself (check the caller's context first).
func Classify(err error) State {
	if err == nil {
		return Fine
	}
	if _, ok := errors.AsType[redis.Error](err); ok {
		switch {
		case redis.HasErrorPrefix(err, "BUSY"), redis.IsTryAgainError(err):
			return Busy // a long script or a resharding: it will answer
		case redis.IsLoadingError(err), redis.IsClusterDownError(err),
			redis.IsMasterDownError(err), redis.IsReadOnlyError(err),
			redis.IsMaxClientsError(err), redis.IsOOMError(err):
			return Gone
		}
		return Fine
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) {
		return Busy
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return Busy
	}
	// Refused, reset, EOF, broken pipe, a closed client, anything else.
	return Gone
}
