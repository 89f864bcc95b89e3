package streamlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// A log is live while its producer's marker is: a producer that stops
// (Run returns) deletes it at once, and one that dies without a word
// stops refreshing it, so it expires within Liveness. A log that names no
// producer (Liveness 0, or written before there were markers) is live
// while it exists, and a missing log is not live.
func TestLiveFollowsTheProducer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	rdb := srv.Client(t)
	r, err := streamlog.NewReader(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	live := func(id string) bool {
		t.Helper()
		ok, err := r.Live(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	// A producer that stops.
	const liveness = 600 * time.Millisecond
	a, err := streamlog.NewAppender(streamlog.Config{Prefix: prefix, TTL: time.Minute, Producer: "api-1", Liveness: liveness},
		rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	a.Open("req-1", "alice")
	a.Append("req-1", streamlog.Event{ID: 1, Data: []byte(`{}`)})
	testutil.Eventually(t, 5*time.Second, func() bool { return live("req-1") }, "the log written with a live producer")
	// Refreshed well within Liveness: still live after several of it.
	held := time.Now()
	for time.Since(held) < 3*liveness {
		if !live("req-1") {
			t.Fatalf("log not live %v after it was written, its producer running", time.Since(held))
		}
		evs, _, err := r.Read(t.Context(), "req-1", "", liveness/4) // paces the checks
		if err != nil || len(evs) != 1 {
			t.Fatalf("read %d events, %v", len(evs), err)
		}
	}
	stop()
	<-done
	if live("req-1") {
		t.Errorf("log still live once its producer stopped")
	}
	if n := rdb.Exists(t.Context(), streamlog.Key(prefix, "req-1")).Val(); n != 1 {
		t.Errorf("the log itself is gone (%d): it stays for its TTL", n)
	}

	// A producer that died: its marker is refreshed no more and expires.
	key := streamlog.Key(prefix, "req-2")
	if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: key, Values: []any{"o", "bob", "p", "api-2"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(t.Context(), streamlog.ProducerKey(prefix, "api-2"), "1", 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if !live("req-2") {
		t.Fatal("log not live while its producer's marker is set")
	}
	died := time.Now()
	testutil.Eventually(t, 5*time.Second, func() bool { return !live("req-2") }, "the dead producer's log no longer live")
	if took := time.Since(died); took > 300*time.Millisecond+time.Second {
		t.Errorf("the log was live %v after its producer's last refresh, want within its marker's TTL", took)
	}

	// No producer named: live while it exists.
	if err := rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: streamlog.Key(prefix, "req-3"), Values: []any{"o", "carol"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if !live("req-3") {
		t.Error("a log naming no producer is not live")
	}
	if live("unknown") {
		t.Error("a missing log is live")
	}
}

// Liveness needs a producer to name, and is not below 3ms.
func TestLivenessConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []streamlog.Config{
		{TTL: time.Minute, Liveness: time.Second},
		{TTL: time.Minute, Liveness: time.Millisecond, Producer: "p"},
		{TTL: time.Minute, Liveness: -time.Second, Producer: "p"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v validated", c)
		}
	}
	if err := (streamlog.Config{TTL: time.Minute, Liveness: time.Second, Producer: "p"}).Validate(); err != nil {
		t.Errorf("a producer with a liveness of 1s: %v", err)
	}
}
