package streamlog_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/spillway-dev/spillway/internal/streamlog"
)

// load is a load on the stream log shaped like the bench's direct
// scenario (docs/bench-history/2026-11.md, "Stream log at load"): Conc streams at
// once, each an owner entry, Chunks chunks and a done event.
type load struct {
	Streams, Conc, Chunks int
	// Rate, when set, bounds the events per second over all streams, a
	// stream's events going out back to back (an unpaced answer).
	Rate float64
	// Pace, when set, spaces a stream's chunks (a paced answer).
	Pace time.Duration
	// ID names stream i's log.
	ID func(i int) string
}

var (
	chunkData = []byte(`{"content":" token"}`)
	doneData  = []byte(`{"request_id":"r","finish_reason":"stop","path":"direct"}`)
)

// run drives l through a and returns how many events were handed over.
func (l load) run(ctx context.Context, a *streamlog.Appender) int64 {
	var lim *rate.Limiter
	if l.Rate > 0 {
		lim = rate.NewLimiter(rate.Limit(l.Rate), l.Chunks+2)
	}
	var next, events atomic.Int64
	var wg sync.WaitGroup
	for w := range l.Conc {
		wg.Go(func() {
			var tick *time.Ticker
			if l.Pace > 0 {
				// Each stream's chunks at their own phase, as answers that
				// started at different times have: not all streams' chunks
				// in the same instant, which one flush would carry at once.
				select {
				case <-time.After(l.Pace * time.Duration(w) / time.Duration(l.Conc)):
				case <-ctx.Done():
					return
				}
				tick = time.NewTicker(l.Pace)
				defer tick.Stop()
			}
			for {
				i := int(next.Add(1)) - 1
				if i >= l.Streams || ctx.Err() != nil {
					return
				}
				if lim != nil && lim.WaitN(ctx, l.Chunks+2) != nil {
					return
				}
				id := l.ID(i)
				a.Open(id, "u")
				for c := 1; c <= l.Chunks; c++ {
					if tick != nil {
						select {
						case <-tick.C:
						case <-ctx.Done():
							return
						}
					}
					a.Append(id, streamlog.Event{ID: int64(c), Data: chunkData})
				}
				a.Append(id, streamlog.Event{ID: int64(l.Chunks + 1), Name: "done", Data: doneData})
				events.Add(int64(l.Chunks + 2))
			}
		})
	}
	wg.Wait()
	return events.Load()
}

// runUntilStopped runs a until the returned stop is called; stop returns
// once every entry handed over is written.
func runUntilStopped(a *streamlog.Appender) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// redisStats is what redis-server reports of its own cost.
type redisStats struct {
	cpu      time.Duration // used_cpu_sys + used_cpu_user
	memory   int64         // used_memory
	commands int64         // total_commands_processed
}

func readRedisStats(tb testing.TB, rdb *redis.Client) redisStats {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "cpu", "memory", "stats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var s redisStats
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "used_cpu_sys", "used_cpu_user":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("INFO %s: %v", k, err)
			}
			s.cpu += time.Duration(f * float64(time.Second))
		case "used_memory":
			s.memory, _ = strconv.ParseInt(v, 10, 64)
		case "total_commands_processed":
			s.commands, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if s.memory == 0 || s.commands == 0 {
		tb.Fatalf("INFO without used_memory or total_commands_processed: %q", info)
	}
	return s
}

// readAll reads log id back whole and reports its events' ids in order.
func readAll(tb testing.TB, r *streamlog.Reader, id string) []int64 {
	tb.Helper()
	var ids []int64
	var cur streamlog.Cursor
	for {
		evs, next, err := r.Read(context.Background(), id, cur, 0)
		if err != nil {
			tb.Fatalf("%s: %v", id, err)
		}
		if len(evs) == 0 && next == cur {
			return ids
		}
		for _, ev := range evs {
			ids = append(ids, ev.ID)
		}
		cur = next
	}
}
