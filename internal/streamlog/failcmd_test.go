package streamlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestEveryRedisCommandFailing fails each Redis command of the log
// reader's paths in turn (an error reply, or a pipeline refused as a
// whole): none panics, and each returns an error.
func TestEveryRedisCommandFailing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	a := startAppender(t, streamlog.Config{Prefix: prefix, TTL: time.Minute, Producer: "api-1", Liveness: time.Minute}, srv)
	a.Open("req-1", "alice")
	a.Append("req-1", streamlog.Event{ID: 1, Data: []byte(`{}`)})
	plain, err := streamlog.NewReader(prefix, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		evs, _, err := plain.Read(ctx, "req-1", "", 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 1 {
			break
		}
	}
	hook := &redistest.FailHook{}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	rdb.AddHook(hook)
	t.Cleanup(func() { _ = rdb.Close() })
	r, err := streamlog.NewReader(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	redistest.FailEachCommand(t, hook,
		redistest.FailPath{Name: "Owner", Run: func() error { _, err := r.Owner(ctx, "req-1"); return err }},
		redistest.FailPath{Name: "Read", Run: func() error { _, _, err := r.Read(ctx, "req-1", "", 0); return err }},
		redistest.FailPath{Name: "Live", Run: func() error { _, err := r.Live(ctx, "req-1"); return err }},
		redistest.FailPath{Name: "Exists", Run: func() error { _, err := r.Exists(ctx, "req-1"); return err }},
		redistest.FailPath{Name: "Attach", Run: func() error { return r.Attach(ctx, "req-1", time.Minute) }},
		redistest.FailPath{Name: "Attached", Run: func() error { _, err := r.Attached(ctx, "req-1"); return err }},
	)
}
