package streamlog_test

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// BenchmarkAppend drives the stream log at saturation: Append per event
// from the benchmark loop (a stream's own path), the appender writing
// pipelined batches to a real redis-server meanwhile. When its buffer is
// full the loop waits for room (counted as full-waits) instead of
// dropping, so ns/op is the end-to-end cost per event until the last one
// is readable: the appender's throughput bound. Also reported: the
// pipelined writes per 1000 events.
func BenchmarkAppend(b *testing.B) {
	srv := redistest.Start(b)
	prefix := redistest.Prefix(b)
	a := startAppender(b, streamlog.Config{Prefix: prefix, TTL: time.Minute}, srv)
	r, _ := streamlog.NewReader(prefix, srv.Client(b))
	data := []byte(`{"content":" token"}`)
	const streams = 64
	ids := make([]string, streams)
	for i := range ids {
		ids[i] = "bench-" + strconv.Itoa(i)
		a.Open(ids[i], "u")
	}
	start, full := a.Batches(), 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		ev := streamlog.Event{ID: int64(i/streams + 1), Data: data}
		for !a.Append(ids[i%streams], ev) {
			full++
			for a.Pending() > streamlog.DefaultBuffer/2 {
				runtime.Gosched()
			}
		}
	}

	// Wait until the last event is in Redis: the appender kept up.
	last := ids[(b.N-1)%streams]
	want := int64((b.N-1)/streams + 1)
	var cur streamlog.Cursor
	for {
		evs, next, err := r.Read(context.Background(), last, cur, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		cur = next
		if len(evs) > 0 && evs[len(evs)-1].ID == want {
			break
		}
	}
	b.ReportMetric(float64(a.Batches()-start)*1000/float64(b.N), "writes/1000events")
	b.ReportMetric(float64(full), "full-waits")
}

// BenchmarkAppendCall is what one event costs the stream that sends it:
// the Append call alone, with room in the buffer (nothing is written).
func BenchmarkAppendCall(b *testing.B) {
	srv := redistest.Start(b)
	a, err := streamlog.NewAppender(streamlog.Config{Prefix: "bench:", TTL: time.Minute, Buffer: b.N + 1}, srv.Client(b), slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	data := []byte(`{"content":" token"}`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if !a.Append("r", streamlog.Event{ID: int64(i + 1), Data: data}) {
			b.Fatal("dropped with room in the buffer")
		}
	}
}

// BenchmarkLogLoad is the stream log under the bench's direct load
// (docs/bench-history/2026-11.md, "Stream log at load"): 200 streams at once of 50
// chunks and a done event each, written to a real redis-server. unpaced:
// each stream's events back to back, 100,000 events/s over all of them
// (above what one api relays at 200 concurrent); paced: a chunk every
// 20 ms per stream, each at its own phase; paced-c50 is the parity
// scenario's paced c = 50, at the default FlushInterval and at the 5 ms
// it was (docs/bench-history/2026-11.md, "Stream log, paced"). b.N is
// streams. Reported per event handed over: the Redis CPU (INFO
// used_cpu_sys + used_cpu_user), the memory the logs hold (used_memory),
// the Redis commands, the pipelined writes; and the entries dropped.
func BenchmarkLogLoad(b *testing.B) {
	for _, c := range []struct {
		name  string
		load  load
		flush time.Duration
	}{
		{"unpaced", load{Conc: 200, Chunks: 50, Rate: 100_000}, 0},
		{"paced", load{Conc: 200, Chunks: 50, Pace: 20 * time.Millisecond}, 0},
		{"paced-c50", load{Conc: 50, Chunks: 50, Pace: 20 * time.Millisecond}, 0},
		{"paced-c50-flush5ms", load{Conc: 50, Chunks: 50, Pace: 20 * time.Millisecond}, 5 * time.Millisecond},
	} {
		b.Run(c.name, func(b *testing.B) {
			srv := redistest.Start(b)
			rdb := srv.Client(b)
			prefix := redistest.Prefix(b)
			a, err := streamlog.NewAppender(streamlog.Config{Prefix: prefix, TTL: time.Minute, FlushInterval: c.flush}, rdb, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			stop := runUntilStopped(a)
			l := c.load
			l.Streams = b.N
			l.ID = func(i int) string { return "load-" + strconv.Itoa(i) }
			before, writes := readRedisStats(b, rdb), a.Batches()
			b.ResetTimer()
			events := l.run(context.Background(), a)
			stop()
			b.StopTimer()
			after := readRedisStats(b, rdb)
			n := float64(events)
			b.ReportMetric(float64(after.cpu-before.cpu)/float64(time.Microsecond)/n, "redis-µs/event")
			b.ReportMetric(float64(after.memory-before.memory)/n, "redis-B/event")
			b.ReportMetric(float64(after.commands-before.commands)/n, "cmds/event")
			b.ReportMetric(float64(a.Batches()-writes)/n, "writes/event")
			b.ReportMetric(float64(a.Dropped()), "dropped")
		})
	}
}
