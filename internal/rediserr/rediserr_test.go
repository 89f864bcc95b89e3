package rediserr

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/redistest"
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
