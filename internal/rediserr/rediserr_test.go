package rediserr

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// timeoutErr is a net.Error that timed out, as a read deadline gives.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want State
	}{
		{nil, Fine},
		{context.DeadlineExceeded, Busy},
		{fmt.Errorf("redispool: acquire: %w", context.DeadlineExceeded), Busy},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, Busy},
		{redis.ErrPoolTimeout, Busy},
		{redis.ErrClosed, Gone},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, Gone},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, Gone},
		{io.EOF, Gone},
		{syscall.EPIPE, Gone},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestClassifyReplies sorts real error replies of a real server.
func TestClassifyReplies(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := s.Client(t)
	ctx := context.Background()
	// A script error is the caller's own: Redis is fine.
	err := c.Eval(ctx, "return redis.error_reply('ERR nope')", nil).Err()
	if err == nil || Classify(err) != Fine {
		t.Fatalf("script error %v classified %v, want fine", err, Classify(err))
	}
	// READONLY: a demoted primary cannot serve the pool.
	if err := c.Do(ctx, "CONFIG", "SET", "replica-read-only", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	other := redistest.Start(t)
	if err := c.Do(ctx, "REPLICAOF", "127.0.0.1", other.Port).Err(); err != nil {
		t.Fatal(err)
	}
	err = c.Set(ctx, "k", "v", 0).Err()
	if err == nil || Classify(err) != Gone {
		t.Fatalf("write on a replica: %v classified %v, want gone", err, Classify(err))
	}
}

// TestExecStampsARefusedPipeline: a client whose password the server
// refuses gets a pipeline error and commands without one (go-redis
// stamps only non-reply errors); Exec puts the error on each command.
func TestExecStampsARefusedPipeline(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	ctx := context.Background()
	if err := s.Client(t).ConfigSet(ctx, "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "wrong", MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })

	raw := c.Pipeline()
	bare := raw.XLen(ctx, "k")
	_, err := raw.Exec(ctx)
	if err == nil || !redis.HasErrorPrefix(err, "WRONGPASS") {
		t.Fatalf("pipeline with a wrong password: %v, want WRONGPASS", err)
	}
	t.Logf("go-redis leaves the command's error %v (value %d)", bare.Err(), bare.Val())

	pipe := c.Pipeline()
	xlen, get := pipe.XLen(ctx, "k"), pipe.Get(ctx, "g")
	if err := Exec(ctx, pipe); err == nil {
		t.Fatal("Exec: no error with a wrong password")
	}
	for _, cmd := range []redis.Cmder{xlen, get} {
		if !redis.HasErrorPrefix(cmd.Err(), "WRONGPASS") {
			t.Errorf("%s after Exec: error %v, want WRONGPASS", cmd.Name(), cmd.Err())
		}
	}
}

// TestExecKeepsEachCommandsOwnReply: a pipeline that ran keeps each
// command's own outcome, the failed one's error and the others' values.
func TestExecKeepsEachCommandsOwnReply(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "s", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pipe := c.Pipeline()
	bad, good, missing := pipe.XLen(ctx, "s"), pipe.Get(ctx, "s"), pipe.Get(ctx, "none")
	if err := Exec(ctx, pipe); err == nil {
		t.Fatal("Exec: no error for XLEN of a string")
	}
	if !redis.HasErrorPrefix(bad.Err(), "WRONGTYPE") {
		t.Errorf("XLEN of a string: %v, want WRONGTYPE", bad.Err())
	}
	if v, err := good.Result(); err != nil || v != "v" {
		t.Errorf("GET s: %q, %v; want v", v, err)
	}
	if err := missing.Err(); err != redis.Nil {
		t.Errorf("GET of a missing key: %v, want redis.Nil", err)
	}
}
