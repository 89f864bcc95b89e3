package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name the Sentinel setup monitors.
const SentinelMaster = "spillway"

// sentinelReady bounds each wait of the Sentinel setup: start and failover.
// A start takes a few seconds (sentinels find each other by hello messages
// every 2 s); a clean-clone CI run, every package's tests at once under
// the race detector on 2 cores, once saw a sentinel still knowing one of
// the two others at 30 s.
const sentinelReady = 60 * time.Second

// Sentinel is a Sentinel-managed primary with one replica and three
// sentinels, all local processes owned by one test.
type Sentinel struct {
	// MasterName is the name the sentinels monitor (SentinelMaster).
	MasterName string
	// Data are the two data nodes; which one is primary changes with
	// Failover (see PrimaryAddr).
	Data []*Server
	// Sentinels are the three sentinel processes.
	Sentinels []*Server
	// SentinelAddrs are the sentinels' host:port addresses.
	SentinelAddrs []string
}

// StartSentinel runs a primary, a replica of it and three sentinels
// (quorum 2) on free ports, and waits until the replica is in sync and
// every sentinel knows the primary, the replica and the other sentinels.
// With -short the calling test is skipped.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	if testing.Short() {
		tb.Skip("redistest: integration test skipped with -short")
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: redis-server not found (make test installs it): %v", err)
	}
	primary := startServer(tb, bin, serverArgs)
	replica := startServer(tb, bin, func(dir string, port int) []string {
		return append(serverArgs(dir, port), "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	})
	s := &Sentinel{MasterName: SentinelMaster, Data: []*Server{primary, replica}}
	for range 3 {
		sn := startServer(tb, bin, func(dir string, port int) []string {
			conf := filepath.Join(dir, "sentinel.conf")
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
				"sentinel monitor %s 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds %[3]s 1000\n"+
				"sentinel failover-timeout %[3]s 10000\n"+
				"sentinel parallel-syncs %[3]s 1\n",
				port, dir, s.MasterName, primary.Port)
			if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
				tb.Fatalf("redistest: write %s: %v", conf, err)
			}
			return []string{conf, "--sentinel"}
		})
		s.Sentinels = append(s.Sentinels, sn)
		s.SentinelAddrs = append(s.SentinelAddrs, sn.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), sentinelReady)
	defer cancel()
	if err := waitUntil(ctx, func(ctx context.Context) error { return replicaInSync(ctx, primary.Addr, replica.Addr) }); err != nil {
		tb.Fatalf("redistest: replica %s not in sync with %s: %v", replica.Addr, primary.Addr, err)
	}
	for _, sn := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1})
		err := waitUntil(ctx, func(ctx context.Context) error {
			return s.sentinelKnowsAll(ctx, c, primary.Addr, replica.Addr)
		})
		_ = c.Close()
		if err != nil {
			tb.Fatalf("redistest: sentinel %s not ready: %v", sn.Addr, err)
		}
	}
	return s
}

// sentinelKnowsAll reports why sentinel c cannot yet fail over from
// primary to replica, or nil.
func (s *Sentinel) sentinelKnowsAll(ctx context.Context, c *redis.SentinelClient, primary, replica string) error {
	addr, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return err
	}
	if len(addr) != 2 || addr[0]+":"+addr[1] != primary {
		return fmt.Errorf("master is %v, want %s", addr, primary)
	}
	reps, err := c.Replicas(ctx, s.MasterName).Result()
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(reps, func(r map[string]string) bool {
		return r["ip"]+":"+r["port"] == replica && r["master-link-status"] == "ok" && !strings.Contains(r["flags"], "down")
	}) {
		return fmt.Errorf("replica %s not known as up: %v", replica, reps)
	}
	others, err := c.Sentinels(ctx, s.MasterName).Result()
	if err != nil {
		return err
	}
	if len(others) != len(s.Sentinels)-1 {
		// Which ones, and how it sees them, for the next failure's reader.
		known := make([]string, 0, len(others))
		for _, o := range others {
			known = append(known, o["ip"]+":"+o["port"]+" ("+o["flags"]+", last hello "+o["last-hello-message"]+" ms ago)")
		}
		return fmt.Errorf("knows %d other sentinels, want %d (all: %v): %v", len(others), len(s.Sentinels)-1, s.SentinelAddrs, known)
	}
	return nil
}

// Options returns failover-client options for the setup.
func (s *Sentinel) Options() *redis.FailoverOptions {
	return &redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: append([]string(nil), s.SentinelAddrs...)}
}

// Client returns a new Sentinel-aware client of the primary, closed when
// the test ends.
func (s *Sentinel) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewFailoverClient(s.Options())
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// PrimaryAddr returns the primary's address as the first sentinel sees it.
func (s *Sentinel) PrimaryAddr(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs[0], MaxRetries: -1})
	defer c.Close()
	addr, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return "", fmt.Errorf("redistest: sentinel get-master-addr-by-name: %w", err)
	}
	if len(addr) != 2 {
		return "", fmt.Errorf("redistest: sentinel get-master-addr-by-name: reply %v", addr)
	}
	return addr[0] + ":" + addr[1], nil
}

// Failover forces a failover with SENTINEL FAILOVER and returns the new
// primary's address once every sentinel names it, it answers as primary,
// and a new Sentinel-aware client writes to it.
//
// Redis replicates asynchronously, so a bare forced failover may lose the
// last writes the old primary acknowledged. Failover is coordinated as
// Redis's own FAILOVER command is: writes on the old primary are paused
// until the replica has caught up, the old primary is made a replica of
// the new one before the pause ends, and clients blocked meanwhile get an
// error instead of writing to a stale primary. Applications see writes
// fail for a moment, never acknowledged writes lost.
func (s *Sentinel) Failover(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelReady)
	defer cancel()
	old, err := s.PrimaryAddr(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var next string
	for _, d := range s.Data {
		if d.Addr != old {
			next = d.Addr
		}
	}
	oldc := redis.NewClient(&redis.Options{Addr: old, MaxRetries: -1})
	defer oldc.Close()
	if err := oldc.Do(ctx, "CLIENT", "PAUSE", sentinelReady.Milliseconds(), "WRITE").Err(); err != nil {
		tb.Fatalf("redistest: client pause on %s: %v", old, err)
	}
	unpaused := false
	defer func() {
		if !unpaused {
			_ = oldc.Do(context.Background(), "CLIENT", "UNPAUSE").Err()
		}
	}()
	if err := waitUntil(ctx, func(ctx context.Context) error { return replicaInSync(ctx, old, next) }); err != nil {
		tb.Fatalf("redistest: replica %s did not catch up with %s: %v", next, old, err)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.SentinelAddrs[0], MaxRetries: -1})
	defer sc.Close()
	if err := waitUntil(ctx, func(ctx context.Context) error { return sc.Failover(ctx, s.MasterName).Err() }); err != nil {
		tb.Fatalf("redistest: sentinel failover %s: %v", s.MasterName, err)
	}
	nextc := redis.NewClient(&redis.Options{Addr: next, MaxRetries: -1})
	defer nextc.Close()
	if err := waitUntil(ctx, func(ctx context.Context) error { return hasRole(ctx, nextc, "master") }); err != nil {
		tb.Fatalf("redistest: %s not promoted: %v", next, err)
	}
	// What the sentinels would do at their next check of the old primary,
	// done at once so no paused client writes to it when the pause ends.
	host, port, _ := strings.Cut(next, ":")
	if err := oldc.ReplicaOf(ctx, host, port).Err(); err != nil {
		tb.Fatalf("redistest: replicaof on %s: %v", old, err)
	}
	if err := oldc.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		tb.Fatalf("redistest: client unpause on %s: %v", old, err)
	}
	unpaused = true
	for _, addr := range s.SentinelAddrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1})
		err := waitUntil(ctx, func(ctx context.Context) error {
			a, err := c.GetMasterAddrByName(ctx, s.MasterName).Result()
			if err != nil {
				return err
			}
			if got := strings.Join(a, ":"); got != next {
				return fmt.Errorf("master is %s, want %s", got, next)
			}
			return nil
		})
		_ = c.Close()
		if err != nil {
			tb.Fatalf("redistest: sentinel %s did not switch: %v", addr, err)
		}
	}
	fc := redis.NewFailoverClient(s.Options())
	defer fc.Close()
	if err := waitUntil(ctx, func(ctx context.Context) error {
		return fc.Set(ctx, "redistest:failover-probe", next, 0).Err()
	}); err != nil {
		tb.Fatalf("redistest: clients do not reach the new primary %s: %v", next, err)
	}
	return next
}

// hasRole reports whether the node's ROLE is role.
func hasRole(ctx context.Context, c *redis.Client, role string) error {
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return err
	}
	if len(v) == 0 || v[0] != role {
		return fmt.Errorf("role is %v, want %s", v, role)
	}
	return nil
}

// replicaInSync reports why replica is not yet a connected replica of
// primary holding all of its replication stream, or nil.
func replicaInSync(ctx context.Context, primary, replica string) error {
	pc := redis.NewClient(&redis.Options{Addr: primary, MaxRetries: -1})
	defer pc.Close()
	rc := redis.NewClient(&redis.Options{Addr: replica, MaxRetries: -1})
	defer rc.Close()
	pinfo, err := pc.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	rinfo, err := rc.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if !strings.Contains(rinfo, "master_link_status:up") {
		return fmt.Errorf("replica link not up:\n%s", rinfo)
	}
	po, ro := infoField(pinfo, "master_repl_offset"), infoField(rinfo, "slave_repl_offset")
	if po == "" || po != ro {
		return fmt.Errorf("primary offset %q, replica offset %q", po, ro)
	}
	return nil
}

func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}
