package streamlog_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func startAppender(tb testing.TB, cfg streamlog.Config, srv *redistest.Server) *streamlog.Appender {
	tb.Helper()
	a, err := streamlog.NewAppender(cfg, srv.Client(tb), testutil.DiscardLogger())
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
	return a
}

// Events appended are read back in order with the owner, batched into
// far fewer writes than events, and the log gets the TTL.
func TestAppendThenRead(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	a := startAppender(t, streamlog.Config{Prefix: prefix, TTL: time.Minute}, srv)
	r, err := streamlog.NewReader(prefix, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 500
	a.Open("req-1", "alice")
	for i := 1; i <= n; i++ {
		a.Append("req-1", streamlog.Event{ID: int64(i), Data: []byte(`{"content":"` + strconv.Itoa(i) + `"}`)})
	}
	a.Append("req-1", streamlog.Event{ID: n + 1, Name: "done", Data: []byte(`{}`)})
	var got []streamlog.Event
	var cur streamlog.Cursor
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n+1 && time.Now().Before(deadline) {
		evs, next, err := r.Read(t.Context(), "req-1", cur, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		got, cur = append(got, evs...), next
	}
	if len(got) != n+1 {
		t.Fatalf("read %d events, want %d", len(got), n+1)
	}
	for i, ev := range got {
		if ev.ID != int64(i+1) {
			t.Fatalf("event %d has id %d", i, ev.ID)
		}
	}
	if got[n].Name != "done" || string(got[0].Data) != `{"content":"1"}` {
		t.Fatalf("first %+v last %+v", got[0], got[n])
	}
	owner, err := r.Owner(t.Context(), "req-1")
	if err != nil || owner != "alice" {
		t.Fatalf("owner %q, %v", owner, err)
	}
	if b := a.Batches(); b < 1 || b > n/10 {
		t.Errorf("%d pipelined writes for %d entries: not batched", b, n+2)
	}
	// A run of one log's events is one entry, not one per event.
	if l := srv.Client(t).XLen(t.Context(), streamlog.Key(prefix, "req-1")).Val(); l < 2 || l > n/10 {
		t.Errorf("%d log entries for %d events: want them batched", l, n+1)
	}
	ttl := srv.Client(t).TTL(t.Context(), streamlog.Key(prefix, "req-1")).Val()
	if ttl <= 0 || ttl > time.Minute {
		t.Errorf("log TTL %v, want within 1m", ttl)
	}
	if _, err := r.Owner(t.Context(), "unknown"); !errors.Is(err, streamlog.ErrNotFound) {
		t.Errorf("unknown owner: %v, want ErrNotFound", err)
	}
}

// A log entry someone else wrote that could inject SSE fields is refused.
func TestReadRefusesMalformedEntry(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	rdb := srv.Client(t)
	r, _ := streamlog.NewReader(prefix, rdb)
	key := streamlog.Key(prefix, "evil")
	for _, vals := range [][]any{
		{"i", "1", "e", "", "d", "{}\n\nevent: done"},
		{"i", "x", "e", "", "d", "{}"},
		{"i", "1", "e", "done\nid: 9", "d", "{}"},
		{"i", "1", "e", ""},
		{"b", ""},
		{"b", "1  {}\n1  {}"},                 // ids must rise
		{"b", "1  {}\n2 done {}\r\nevent: x"}, // a carriage return
		{"b", "1  {}\nx  {}"},
		{"b", "1 {}"},  // no data
		{"b", "0  {}"}, // id 0
		{"b", "1  {}\n2  "},
	} {
		rdb.Del(t.Context(), key)
		rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: key, Values: vals})
		if _, _, err := r.Read(t.Context(), "evil", "", 0); !errors.Is(err, streamlog.ErrMalformed) {
			t.Errorf("%v: err %v, want ErrMalformed", vals, err)
		}
	}
}

// While Redis stalls, entries wait, up to Buffer besides the write under
// way; the backlog goes out in pipelines of up to Buffer entries, and
// what does not fit is dropped and counted, never blocking the appending
// stream.
func TestBacklogAndDrops(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	const maxBatch, buffer, n = 16, 1024, 1500
	var onDrop atomic.Int64
	a := startAppender(t, streamlog.Config{Prefix: prefix, TTL: time.Minute, MaxBatch: maxBatch, Buffer: buffer,
		OnDrop: func() { onDrop.Add(1) }}, srv)
	admin := srv.Client(t)
	// One write goes out, then Redis stalls writes and a second write
	// (another log's) is under way, waiting: everything appended from here
	// piles up behind it, up to Buffer. (Without that plug in flight the
	// writer could take part of the burst into its next write as it
	// arrives, and fewer than Buffer would wait.)
	a.Open("req-b", "alice")
	testutil.Eventually(t, 5*time.Second, func() bool { return a.Batches() == 1 && a.Pending() == 0 }, "the first write out")
	// Long enough that a loaded machine cannot outlast it before the
	// burst is appended (3 s once was); lifted as soon as it is.
	if err := admin.Do(t.Context(), "CLIENT", "PAUSE", "30000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	paused := true
	unpause := func() {
		if paused {
			paused = false
			if err := admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Errorf("CLIENT UNPAUSE: %v", err)
			}
		}
	}
	t.Cleanup(unpause)
	a.Open("req-plug", "alice")
	testutil.Eventually(t, 10*time.Second, func() bool { return a.Batches() == 2 && a.Pending() == 1 }, "the plug's write under way")
	start := time.Now()
	kept := 0
	for i := 1; i <= n; i++ {
		if a.Append("req-b", streamlog.Event{ID: int64(i), Data: []byte(`{}`)}) {
			kept++
		}
	}
	// Redis stays paused for 30 s: an Append that waited for it would
	// take that long.
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("appending %d entries took %v while Redis stalled: Append must not wait", n, took)
	}
	unpause()
	if dropped := a.Dropped(); dropped == 0 || int(dropped)+kept != n || onDrop.Load() != dropped {
		t.Fatalf("kept %d and dropped %d of %d (OnDrop called %d times): want some dropped, every entry either, each drop reported",
			kept, dropped, n, onDrop.Load())
	}
	r, err := streamlog.NewReader(prefix, admin)
	if err != nil {
		t.Fatal(err)
	}
	var got []streamlog.Event
	var cur streamlog.Cursor
	testutil.Eventually(t, 10*time.Second, func() bool {
		evs, next, err := r.Read(t.Context(), "req-b", cur, 0)
		if err != nil {
			t.Fatal(err)
		}
		got, cur = append(got, evs...), next
		return len(got) == kept
	}, "every kept entry written once Redis answers")
	for i := 1; i < len(got); i++ {
		if got[i].ID <= got[i-1].ID {
			t.Fatalf("event %d has id %d after %d: out of order", i, got[i].ID, got[i-1].ID)
		}
	}
	// The backlog went out in pipelines of up to Buffer entries, not one
	// per MaxBatch: the first write, the one the stall held, then the rest.
	if b, most := a.Batches(), int64(2+(kept+buffer-1)/buffer); b > most {
		t.Errorf("%d pipelines for a backlog of %d entries, want at most %d (one per MaxBatch would be %d)", b, kept, most, kept/maxBatch)
	}
}

// Events of several logs appended interleaved come back per log, in
// order; an event that cannot go in a batch line (its data holds a line
// break) is written apart and refused by the reader as ever, after the
// events before it.
func TestInterleavedLogsAndUnbatchable(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	a := startAppender(t, streamlog.Config{Prefix: prefix, TTL: time.Minute}, srv)
	r, _ := streamlog.NewReader(prefix, srv.Client(t))
	logs := []string{"il-a", "il-b", "il-c"}
	for _, id := range logs {
		a.Open(id, "alice")
	}
	const n = 200
	for i := 1; i <= n; i++ {
		for _, id := range logs {
			a.Append(id, streamlog.Event{ID: int64(i), Data: []byte(`{"content":"` + id + " " + strconv.Itoa(i) + `"}`)})
		}
	}
	a.Append("il-c", streamlog.Event{ID: n + 1, Data: []byte("{}\n\nevent: done")})
	a.Append("il-c", streamlog.Event{ID: n + 2, Name: "done", Data: []byte(`{}`)})
	for _, id := range logs {
		var got []streamlog.Event
		var cur streamlog.Cursor
		var readErr error
		testutil.Eventually(t, 5*time.Second, func() bool {
			evs, next, err := r.Read(t.Context(), id, cur, 0)
			got, cur, readErr = append(got, evs...), next, err
			return err != nil || len(got) >= n
		}, "events of "+id)
		if len(got) != n {
			t.Fatalf("%s: read %d events, want %d", id, len(got), n)
		}
		for i, ev := range got {
			if want := `{"content":"` + id + " " + strconv.Itoa(i+1) + `"}`; ev.ID != int64(i+1) || string(ev.Data) != want {
				t.Fatalf("%s: event %d is %d %q, want %d %q", id, i, ev.ID, ev.Data, i+1, want)
			}
		}
		if id != "il-c" {
			continue
		}
		if readErr == nil {
			testutil.Eventually(t, 5*time.Second, func() bool {
				_, _, readErr = r.Read(t.Context(), id, cur, 0)
				return readErr != nil
			}, "the unbatchable entry read")
		}
		if !errors.Is(readErr, streamlog.ErrMalformed) {
			t.Fatalf("the entry with a line break: %v, want ErrMalformed", readErr)
		}
	}
}

// Stopping the appender loses nothing handed to it: Run stopped with
// entries waiting writes them all, also those it takes in a flush of its
// own as it stops (with MaxBatch 1 every entry taken is flushed at once,
// and Run's select takes an entry or sees the stop in either order).
func TestStopWritesWhatWasAppended(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	r, err := streamlog.NewReader(prefix, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	const runs, events = 20, 5
	for run := range runs {
		a, err := streamlog.NewAppender(streamlog.Config{Prefix: prefix, TTL: time.Minute, MaxBatch: 1},
			srv.Client(t), testutil.DiscardLogger())
		if err != nil {
			t.Fatal(err)
		}
		id := "req-" + strconv.Itoa(run)
		for i := 1; i <= events; i++ {
			a.Append(id, streamlog.Event{ID: int64(i), Data: []byte(`{"content":"x"}`)})
		}
		a.Run(stopped) // returns once stopped: what it wrote is in Redis
		evs, _, err := r.Read(t.Context(), id, "", 0)
		if err != nil || len(evs) != events {
			t.Fatalf("run %d: %d of %d events written before the stop returned (%v)", run, len(evs), events, err)
		}
	}
}

// A paced stream (a chunk every FlushInterval/10) has its chunks carried
// several to an entry: at most one entry per FlushInterval it ran, not
// one per chunk, and every event is read back in order. The bound comes
// from the time the chunks took, so a slow machine loosens it rather than
// failing it.
func TestPacedStreamEntriesCarrySeveralChunks(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	const interval, chunks = 50 * time.Millisecond, 60
	a := startAppender(t, streamlog.Config{Prefix: prefix, TTL: time.Minute, FlushInterval: interval}, srv)
	r, err := streamlog.NewReader(prefix, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(interval / 10)
	defer tick.Stop()
	start := time.Now()
	a.Open("paced", "alice")
	for i := 1; i <= chunks; i++ {
		<-tick.C
		a.Append("paced", streamlog.Event{ID: int64(i), Data: []byte(`{"content":" token"}`)})
	}
	a.Append("paced", streamlog.Event{ID: chunks + 1, Name: "done", Data: []byte(`{}`)})
	took := time.Since(start)
	var ids []int64
	var cur streamlog.Cursor
	deadline := time.Now().Add(5 * time.Second)
	for len(ids) < chunks+1 && time.Now().Before(deadline) {
		evs, next, err := r.Read(t.Context(), "paced", cur, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			ids = append(ids, ev.ID)
		}
		cur = next
	}
	for i, id := range ids {
		if id != int64(i+1) {
			t.Fatalf("event %d has id %d: %v", i, id, ids)
		}
	}
	if len(ids) != chunks+1 {
		t.Fatalf("read %d events, want %d", len(ids), chunks+1)
	}
	// One write per FlushInterval at most, and one more for the events
	// gathered while the last was under way; the owner entry is one too.
	entries := srv.Client(t).XLen(t.Context(), streamlog.Key(prefix, "paced")).Val()
	most := 2 + int64(took/interval) + 1
	if entries > most || entries >= chunks/2 {
		t.Errorf("%d entries for %d chunks over %v: want at most %d (one per %v flush), fewer than one per two chunks",
			entries, chunks, took.Round(time.Millisecond), min(most, chunks/2-1), interval)
	}
}
