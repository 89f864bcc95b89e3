package redispool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// BenchmarkTryAcquireRelease measures one TryAcquire plus its Release
// against a real redis-server, one at a time and with 16 goroutines per
// CPU sharing one Pool (each its own user), without idle leases (two
// script calls a pair) and with them (idle.go: none in the common case,
// one when every pair is another user's: "distinct"),
// and reports ops/s, the p50/p99 latency of the pair and the Redis
// commands the Pool's client sent per pair (calls/op).
func BenchmarkTryAcquireRelease(b *testing.B) {
	s := redistest.Start(b)
	for _, mode := range []struct {
		name string
		hold time.Duration
	}{{"release", 0}, {"idle", DefaultIdleHold}} {
		cfg := Config{Size: 1 << 20, PerUser: 1 << 20, LeaseTTL: 30 * time.Second, IdleHold: mode.hold}

		b.Run(mode.name+"/serial", func(b *testing.B) {
			cfg := cfg
			cfg.Prefix = redistest.Prefix(b)
			p, cc := newCountedPool(b, s.Addr, cfg)
			ctx := context.Background()
			if mode.hold > 0 {
				warmIdle(b, p, "u", 1)
			}
			lat := make([]time.Duration, 0, 1<<16)
			calls := cc.calls.Load()
			for b.Loop() {
				start := time.Now()
				l, err := p.TryAcquire(ctx, "u")
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
				lat = append(lat, time.Since(start))
			}
			reportLatency(b, lat)
			b.ReportMetric(float64(cc.calls.Load()-calls)/float64(len(lat)), "calls/op")
		})

		// Every pair by another user: with idle leases the acquire gives
		// the previous user's idle lease back in its own call (swap).
		b.Run(mode.name+"/distinct", func(b *testing.B) {
			cfg := cfg
			cfg.Prefix = redistest.Prefix(b)
			p, cc := newCountedPool(b, s.Addr, cfg)
			ctx := context.Background()
			if mode.hold > 0 {
				warmIdle(b, p, "u", 1)
			}
			users := make([]string, 1024)
			for i := range users {
				users[i] = newID()
			}
			lat := make([]time.Duration, 0, 1<<16)
			calls := cc.calls.Load()
			for b.Loop() {
				start := time.Now()
				l, err := p.TryAcquire(ctx, users[len(lat)%len(users)])
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
				lat = append(lat, time.Since(start))
			}
			reportLatency(b, lat)
			b.ReportMetric(float64(cc.calls.Load()-calls)/float64(len(lat)), "calls/op")
		})

		b.Run(mode.name+"/parallel", func(b *testing.B) {
			cfg := cfg
			cfg.Prefix = redistest.Prefix(b)
			p, cc := newCountedPool(b, s.Addr, cfg)
			ctx := context.Background()
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(16)
			calls := cc.calls.Load()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				user := newID()
				mine := make([]time.Duration, 0, 1<<12)
				for pb.Next() {
					start := time.Now()
					l, err := p.TryAcquire(ctx, user)
					if err != nil {
						b.Error(err)
						return
					}
					l.Release()
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			reportLatency(b, lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(cc.calls.Load()-calls)/float64(len(lat)), "calls/op")
			}
		})
	}
}

func reportLatency(b *testing.B, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "ops/s")
}

// BenchmarkStreamsPerSecond measures the ceiling of new streams per
// second through the pool's one primary (docs/bench-history/2026-11.md, "New
// streams per second through the pool"): each op is one stream, a slot
// taken and given back, by 128 goroutines at once sharing one Pool, each
// its own identity and without idle leases, so every stream needs Redis.
//   - per-stream: the path before slot blocks, one script call to acquire
//     (block.lua with one request) and one to release (release.lua) per
//     stream;
//   - direct: TryAcquire and Release, in slot blocks (block.go);
//   - queued: AcquireSince and Release, as a worker takes its slot while
//     slots are free (its first try goes in a block too);
//   - queued-full: the same with 32 slots for the 128 goroutines, so 96
//     identities wait in line and are served by the dispatcher, one
//     block.lua call a pass for its whole line (wait.go).
//
// Against one redis-server and against a Redis Cluster of 3 primaries
// (the pool's keys share the {pool} hash tag: one slot, one primary).
// It reports streams/s, the p50/p99 of acquire plus release, the script
// calls and the Redis CPU (every primary's, INFO cpu) per stream, and per-stream's calls that timed out (500 ms), which
// the api took for a full pool before slot blocks.
func BenchmarkStreamsPerSecond(b *testing.B) {
	for _, deploy := range []string{"single", "cluster3"} {
		b.Run(deploy, func(b *testing.B) {
			var newClient func(testing.TB) redis.UniversalClient
			if deploy == "single" {
				s := redistest.Start(b)
				newClient = func(tb testing.TB) redis.UniversalClient { return s.Client(tb) }
			} else {
				c := redistest.StartCluster(b, 3)
				newClient = func(tb testing.TB) redis.UniversalClient { return c.Client(tb) }
			}
			for _, mode := range []string{"per-stream", "direct", "queued", "queued-full"} {
				b.Run(mode, func(b *testing.B) {
					cfg := Config{Prefix: redistest.Prefix(b), Size: 1 << 20, PerUser: 1 << 20, LeaseTTL: 30 * time.Second}
					if mode == "queued-full" {
						cfg.Size = 32 // a quarter of the goroutines: the others wait in line
					}
					rdb := newClient(b)
					cc := &callCounter{}
					rdb.AddHook(cc)
					tg := target{deploy, func(testing.TB) redis.UniversalClient { return rdb }}
					p := newTestPoolOn(b, tg, cfg, nil, nil)
					stream := streamOp(b, p, mode)
					// Load the scripts before timing.
					if err := stream(context.Background(), "warm"); err != nil {
						b.Fatal(err)
					}
					var mu sync.Mutex
					var lat []time.Duration
					var timedOut atomic.Int64
					b.SetParallelism(64)
					calls := cc.calls.Load()
					cpu := redisCPU(b, rdb)
					b.ResetTimer()
					b.RunParallel(func(pb *testing.PB) {
						ctx := context.Background()
						user := newID()
						mine := make([]time.Duration, 0, 1<<12)
						for pb.Next() {
							start := time.Now()
							err := stream(ctx, user)
							if _, slow := errors.AsType[*slowError](err); slow && mode == "per-stream" {
								timedOut.Add(1) // what the api took for a full pool
								continue
							}
							if err != nil {
								b.Error(err)
								return
							}
							mine = append(mine, time.Since(start))
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					})
					b.StopTimer()
					cpu = redisCPU(b, rdb) - cpu
					if len(lat) == 0 {
						return
					}
					b.ReportMetric(cpu.Seconds()*1e6/float64(len(lat)), "redis-µs/stream")
					reportLatency(b, lat)
					b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "streams/s")
					b.ReportMetric(float64(cc.calls.Load()-calls)/float64(len(lat)), "calls/stream")
					b.ReportMetric(float64(timedOut.Load())/float64(len(lat)), "timeouts/stream")
				})
			}
		})
	}
}

// streamOp returns one stream's pool work in mode (BenchmarkStreamsPerSecond).
func streamOp(b *testing.B, p *Pool, mode string) func(ctx context.Context, user string) error {
	b.Helper()
	switch mode {
	case "per-stream":
		return func(ctx context.Context, user string) error {
			id := p.newLeaseID()
			rep, err := p.runAcquire(ctx, user, id, "", 0)
			if err != nil {
				return err
			}
			if rep.code != codeGranted {
				return fmt.Errorf("block.lua refused with code %d", rep.code)
			}
			_, err = p.runRelease(ctx, []string{id}, []string{user})
			return err
		}
	case "direct":
		return func(ctx context.Context, user string) error {
			l, err := p.TryAcquire(ctx, user)
			if err != nil {
				return err
			}
			l.Release()
			return nil
		}
	case "queued", "queued-full":
		return func(ctx context.Context, user string) error {
			l, err := p.AcquireSince(ctx, user, time.Now())
			if err != nil {
				return err
			}
			l.Release()
			return nil
		}
	}
	b.Fatalf("unknown mode %q", mode)
	return nil
}

// redisCPU returns the CPU time (user + system) the Redis primaries behind
// rdb have used so far.
func redisCPU(tb testing.TB, rdb redis.UniversalClient) time.Duration {
	tb.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var total time.Duration
	add := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\r\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
				continue
			}
			sec, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("INFO cpu %s: %w", line, err)
			}
			mu.Lock()
			total += time.Duration(sec * float64(time.Second))
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, add)
	case *redis.Client:
		err = add(ctx, c)
	default:
		tb.Fatalf("redisCPU: client %T", rdb)
	}
	if err != nil {
		tb.Fatalf("redisCPU: %v", err)
	}
	return total
}
