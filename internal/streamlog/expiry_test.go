package streamlog_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// A log's expiry is set with its owner entry (to TTL plus the refresh
// interval, 1 s here), not again by writes within that interval, again
// by the first write after it, and to TTL exactly by the terminal event:
// the log lives at least TTL after its last write, without a PEXPIRE per
// write. The test moves the expiry far out by hand to see whether a write
// set it.
func TestExpirySetOnOpenEveryIntervalAndAtTheEnd(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	rdb := srv.Client(t)
	const ttl = 10 * time.Second
	const every = time.Second // min(TTL/10, 1s)
	a := startAppender(t, streamlog.Config{Prefix: prefix, TTL: ttl}, srv)
	key := streamlog.Key(prefix, "exp")
	written := func(what string) {
		t.Helper()
		testutil.Eventually(t, 5*time.Second, func() bool { return a.Pending() == 0 }, what+" written")
	}
	pttl := func() time.Duration {
		t.Helper()
		d, err := rdb.PTTL(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	const far = time.Hour
	moveFar := func() {
		t.Helper()
		if err := rdb.PExpire(t.Context(), key, far).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// The expiry is set at or after opened; a write within every of
	// opened is within every of it.
	opened := time.Now()
	a.Open("exp", "alice")
	a.Append("exp", streamlog.Event{ID: 1, Data: []byte(`{"content":"a"}`)})
	written("the owner entry")
	set := time.Now() // the expiry was set by now
	if d := pttl(); d <= ttl || d > ttl+every {
		t.Fatalf("expiry after the owner entry %v, want in (%v, %v]", d, ttl, ttl+every)
	}

	moveFar()
	a.Append("exp", streamlog.Event{ID: 2, Data: []byte(`{"content":"b"}`)})
	written("event 2")
	if time.Since(opened) < every {
		if d := pttl(); d <= far-time.Minute {
			t.Fatalf("a write %v after the last expiry set it again (%v left)", time.Since(opened), d)
		}
	}

	// Once the interval has passed, the next write sets it again.
	<-time.After(time.Until(set.Add(every)))
	a.Append("exp", streamlog.Event{ID: 3, Data: []byte(`{"content":"c"}`)})
	written("event 3")
	if d := pttl(); d <= ttl || d > ttl+every {
		t.Fatalf("expiry after a write past the interval %v, want in (%v, %v]", d, ttl, ttl+every)
	}

	moveFar()
	a.Append("exp", streamlog.Event{ID: 4, Name: "done", Data: []byte(`{}`)})
	written("the done event")
	if d := pttl(); d <= 0 || d > ttl {
		t.Fatalf("expiry after the terminal event %v, want TTL %v", d, ttl)
	}
}

// A short log is compacted when its stream ends (COPY and RENAME): it
// reads back the same, keeps its TTL, and takes less than the 4 KB
// listpack node Redis 7.0 preallocates for a stream (4.7 KB for any short log
// before). A log still running is not.
func TestShortLogCompactedWhenItEnds(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	rdb := srv.Client(t)
	a := startAppender(t, streamlog.Config{Prefix: prefix, TTL: time.Minute}, srv)
	r, err := streamlog.NewReader(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	usage := func(id string) int64 {
		t.Helper()
		n, err := rdb.MemoryUsage(t.Context(), streamlog.Key(prefix, id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, id := range []string{"ended", "running"} {
		a.Open(id, "alice")
		for i := 1; i <= 50; i++ {
			a.Append(id, streamlog.Event{ID: int64(i), Data: []byte(`{"content":" token"}`)})
		}
	}
	a.Append("ended", streamlog.Event{ID: 51, Name: "done", Data: []byte(`{"finish_reason":"stop"}`)})
	testutil.Eventually(t, 5*time.Second, func() bool { return a.Pending() == 0 }, "the logs written")
	if n := usage("running"); n < 4096 {
		t.Fatalf("a running log takes %d bytes: Redis no longer preallocates, so compacting is moot", n)
	}
	if n := usage("ended"); n >= 3000 {
		t.Fatalf("an ended log of 51 events takes %d bytes, want it compacted below 3000", n)
	}
	ids := readAll(t, r, "ended")
	if len(ids) != 51 || ids[0] != 1 || ids[50] != 51 {
		t.Fatalf("the compacted log reads back %v", ids)
	}
	if owner, err := r.Owner(t.Context(), "ended"); err != nil || owner != "alice" {
		t.Fatalf("owner %q, %v", owner, err)
	}
	if d := rdb.PTTL(t.Context(), streamlog.Key(prefix, "ended")).Val(); d <= 50*time.Second || d > time.Minute {
		t.Fatalf("compacted log's TTL %v, want about a minute", d)
	}
	// The copy it was made through is gone: only the log and the running
	// one are left under the prefix.
	if keys := rdb.Keys(t.Context(), prefix+"*").Val(); len(keys) != 2 {
		t.Fatalf("keys after compacting: %v, want the two logs", keys)
	}
}

// On a Redis Cluster the two commands of a compaction go to the log's
// node (the copy shares its slot): the ended log is compacted there and
// reads back whole.
func TestShortLogCompactedOnACluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	rdb := c.Client(t)
	prefix := redistest.Prefix(t)
	a, r := runAppender(t, prefix, rdb, testutil.DiscardLogger())
	ids := []string{"c1", "c2", "c3", "c4", "c5", "c6"} // on more than one node
	for _, id := range ids {
		a.Open(id, "alice")
		for i := 1; i <= 50; i++ {
			a.Append(id, streamlog.Event{ID: int64(i), Data: []byte(`{"content":" token"}`)})
		}
		a.Append(id, streamlog.Event{ID: 51, Name: "done", Data: []byte(`{}`)})
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return a.Pending() == 0 }, "the logs written")
	nodes := map[string]bool{}
	for _, id := range ids {
		key := streamlog.Key(prefix, id)
		node, err := c.NodeFor(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[node] = true
		if n := rdb.MemoryUsage(t.Context(), key).Val(); n >= 3000 {
			t.Errorf("%s takes %d bytes, want it compacted below 3000", id, n)
		}
		if got := readAll(t, r, id); len(got) != 51 || got[50] != 51 {
			t.Errorf("%s reads back %v", id, got)
		}
		if d := rdb.PTTL(t.Context(), key).Val(); d <= 50*time.Second || d > time.Minute {
			t.Errorf("%s: TTL %v, want about a minute", id, d)
		}
	}
	if len(nodes) < 2 {
		t.Errorf("the logs sat on %d node(s), want more than one", len(nodes))
	}
}

// On miniredis, which the embedded mode runs on, compacting a log is
// harmless too: no warning, the log reads back whole with its TTL.
func TestCompactHarmlessOnMiniredis(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	var warned atomic.Int64
	log := slog.New(warnCounter{&warned})
	a, err := streamlog.NewAppender(streamlog.Config{Prefix: "mr:", TTL: time.Minute}, rdb, log)
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilStopped(a)
	a.Open("m", "alice")
	a.Append("m", streamlog.Event{ID: 1, Data: []byte(`{"content":"x"}`)})
	a.Append("m", streamlog.Event{ID: 2, Name: "done", Data: []byte(`{}`)})
	stop()
	if n := warned.Load(); n != 0 {
		t.Fatalf("%d warnings: a compaction the server cannot do failed the write", n)
	}
	r, _ := streamlog.NewReader("mr:", rdb)
	if ids := readAll(t, r, "m"); len(ids) != 2 {
		t.Fatalf("log reads back %v", ids)
	}
	if ttl := mr.TTL(streamlog.Key("mr:", "m")); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("TTL %v", ttl)
	}
}

// On a server that refuses COPY, or RENAME (a managed Redis may deny
// either; rename-command disables it here), an ended log is left as it
// was: the write succeeds without a warning, the log reads back whole
// with its TTL, no copy is left beside it, and the appender tries no
// more compactions after the first refusal, which it notes once.
func TestCompactionOffWhenServerRefuses(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"COPY", "RENAME"} {
		t.Run(cmd, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartWith(t, "--rename-command", cmd, "")
			prefix := redistest.Prefix(t)
			rdb := srv.Client(t)
			var warned, noted atomic.Int64
			a, r := runAppender(t, prefix, rdb, slog.New(levelCounter{warn: &warned, info: &noted}))
			for _, id := range []string{"first", "second"} {
				a.Open(id, "alice")
				for i := 1; i <= 5; i++ {
					a.Append(id, streamlog.Event{ID: int64(i), Data: []byte(`{"content":" token"}`)})
				}
				a.Append(id, streamlog.Event{ID: 6, Name: "done", Data: []byte(`{}`)})
				testutil.Eventually(t, 5*time.Second, func() bool { return a.Pending() == 0 }, "the log written")
				if ids := readAll(t, r, id); len(ids) != 6 || ids[5] != 6 {
					t.Fatalf("%s reads back %v", id, ids)
				}
				if d := rdb.PTTL(t.Context(), streamlog.Key(prefix, id)).Val(); d <= 50*time.Second || d > time.Minute {
					t.Fatalf("%s: TTL %v, want about a minute", id, d)
				}
			}
			if n := warned.Load(); n != 0 {
				t.Errorf("%d warnings: a compaction the server refused failed the write", n)
			}
			if n := noted.Load(); n != 1 {
				t.Errorf("%d notes of compaction turned off, want 1", n)
			}
			if keys := rdb.Keys(t.Context(), prefix+"*").Val(); len(keys) != 2 {
				t.Errorf("keys: %v, want the two logs and no copy", keys)
			}
			if cmd == "RENAME" {
				// COPY worked for the first log only: the second was not tried.
				stats := rdb.Info(t.Context(), "commandstats").Val()
				if !strings.Contains(stats, "cmdstat_copy:calls=1,") {
					t.Errorf("COPY calls: want 1 (none after the refused RENAME) in\n%s", stats)
				}
			}
		})
	}
}

// runAppender runs an appender of logs that live a minute on rdb until
// the test ends, and returns it with a reader of its logs.
func runAppender(tb testing.TB, prefix string, rdb redis.UniversalClient, log *slog.Logger) (*streamlog.Appender, *streamlog.Reader) {
	tb.Helper()
	a, err := streamlog.NewAppender(streamlog.Config{Prefix: prefix, TTL: time.Minute}, rdb, log)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(runUntilStopped(a))
	r, err := streamlog.NewReader(prefix, rdb)
	if err != nil {
		tb.Fatal(err)
	}
	return a, r
}

// levelCounter counts records of level Warn and above in warn, and of
// level Info in info.
type levelCounter struct{ warn, info *atomic.Int64 }

func (c levelCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (c levelCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		c.warn.Add(1)
	} else {
		c.info.Add(1)
	}
	return nil
}
func (c levelCounter) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c levelCounter) WithGroup(string) slog.Handler      { return c }

// warnCounter counts the records of level Warn and above.
type warnCounter struct{ n *atomic.Int64 }

func (w warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnCounter) Handle(context.Context, slog.Record) error    { w.n.Add(1); return nil }
func (w warnCounter) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w warnCounter) WithGroup(string) slog.Handler                { return w }
