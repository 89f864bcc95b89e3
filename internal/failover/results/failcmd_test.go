package results_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestEveryRedisCommandFailing fails each Redis command of the result
// channel's paths in turn: publishes (alone, and several at once, which
// share one pipeline), the cancel check and a cancel. None panics, and a
// failed command is an error to its caller, never a publish that "nobody
// heard" (which would cancel a job whose client still listens).
func TestEveryRedisCommandFailing(t *testing.T) {
	t.Parallel()
	env := redistest.StartFail(t)
	srv, prefix, hook, rdb := env.Server, env.Prefix, env.Hook, env.Client
	pub, err := results.NewPublisher(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := results.NewSubscriber(results.SubscriberConfig{Prefix: prefix}, srv.Client(t), testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	hooked, err := results.NewSubscriber(results.SubscriberConfig{Prefix: prefix}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hooked.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const n = 6
	for i := range n { // every channel is heard
		s, err := sub.SubscribeResults(ctx, fmt.Sprint("r", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
	}
	// published publishes on r<i>'s channel: every channel is heard, so
	// a publish without an error that nobody heard read a failed reply.
	published := func(i int) error {
		heard, err := pub.PublishResult(ctx, fmt.Sprint("r", i), []byte("SIGNAL:HEARTBEAT"))
		if err == nil && !heard {
			t.Errorf("publish on r%d: no error, and nobody heard it", i)
		}
		return err
	}
	redistest.FailEachCommand(t, hook,
		redistest.FailPath{Name: "Publish", Run: func() error { return published(0) }},
		redistest.FailPath{Name: "Publish, several at once", Run: func() error {
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { errs[i] = published(i) })
			}
			wg.Wait()
			return errors.Join(errs...)
		}},
		redistest.FailPath{Name: "Cancelled", Run: func() error {
			_, err := pub.Cancelled(ctx, "r0")
			return err
		}},
		redistest.FailPath{Name: "Cancel", Run: func() error { return hooked.Cancel(ctx, "r9", time.Minute) }},
	)
}
