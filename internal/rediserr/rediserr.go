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

// Exec runs pipe and makes every command's error say what happened to
// it. go-redis stamps a pipeline's failure on its commands only when the
// failure is not an error reply: a connection whose AUTH is refused
// (WRONGPASS after a rotated requirepass, NOAUTH) fails the whole pipeline
// with commands that carry neither an error nor a value, and reading such
// a command's value as a reply dereferences nil. When Exec fails and no
// command carries an error, Exec puts that error on every command, so the
// caller may check each command alone. It returns Exec's error.
func Exec(ctx context.Context, pipe redis.Pipeliner) error {
	cmds, err := pipe.Exec(ctx)
	Stamp(cmds, err)
	return err
}

// Stamp is Exec's repair for commands a pipeline already ran (Pipelined,
// TxPipelined): when err is set and no command carries an error, it puts
// err on every command.
func Stamp(cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return
		}
	}
	for _, c := range cmds {
		c.SetErr(err)
	}
}
