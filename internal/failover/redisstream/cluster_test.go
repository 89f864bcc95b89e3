package redisstream

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// backend is a real Redis deployment a test runs against.
type backend struct {
	name   string
	client func(testing.TB) redis.UniversalClient
}

// backends starts one redis-server and one 3-node Redis Cluster for the
// calling test and its subtests.
func backends(t *testing.T) []backend {
	t.Helper()
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	return []backend{
		{"single", func(tb testing.TB) redis.UniversalClient { return srv.Client(tb) }},
		{"cluster", func(tb testing.TB) redis.UniversalClient { return cluster.Client(tb) }},
	}
}

func TestShardKeys(t *testing.T) {
	t.Parallel()
	if got := ShardPriorityStreamKey("queue:", 3, protocol.PriorityNormal); got != "queue:streaming_requests_failover:{s3}" {
		t.Errorf("ShardStreamKey = %q", got)
	}
	if got := ShardDeadLetterKey("queue:", 0); got != "queue:dead_letter:{s0}" {
		t.Errorf("ShardDeadLetterKey = %q", got)
	}
	for _, tc := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Consumer: "c", Shards: 64}, true},
		{Config{Consumer: "c", Shards: 65}, false},
		{Config{Consumer: "c", Shards: -1}, false},
		{Config{Consumer: "c", ShardBlock: -time.Millisecond}, false},
		{Config{Consumer: "c", ShardBlock: time.Microsecond}, false},
	} {
		if err := tc.cfg.withDefaults().Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
		}
	}
}

// TestShardLayout: with four shards jobs spread over four hash-tagged
// streams, the depth is their sum, each dead-letter stream sits in its job
// stream's slot, and on a Cluster the shards spread over the nodes. With
// one shard on a single Redis the names stay the unsharded ones; on a
// Cluster even one shard is tagged, so the dead-letter move stays in one
// slot.
func TestShardLayout(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := b.client(t)
			ctx := ctxT(t, 20*time.Second)
			prefix := redistest.Prefix(t)

			one := newShardedQueue(t, c, prefix+"one:", "a", 1)
			want := []string{StreamKey(prefix + "one:")}
			if b.name == "cluster" {
				want = []string{ShardPriorityStreamKey(prefix+"one:", 0, protocol.PriorityNormal)}
			}
			if !slices.Equal(one.Streams(), want) {
				t.Fatalf("one shard: streams %q, want %q", one.Streams(), want)
			}

			q := newShardedQueue(t, c, prefix, "a", 4)
			const n = 200
			for i := range n {
				if err := q.Enqueue(ctx, fmt.Sprintf("req-%d", i), []byte("job")); err != nil {
					t.Fatal(err)
				}
			}
			var sum int64
			for i, key := range q.Streams() {
				if key != ShardPriorityStreamKey(prefix, i, protocol.PriorityNormal) {
					t.Fatalf("stream %d = %q, want %q", i, key, ShardPriorityStreamKey(prefix, i, protocol.PriorityNormal))
				}
				l := c.XLen(ctx, key).Val()
				if l < n/10 {
					t.Errorf("shard %d holds %d of %d jobs: not spread", i, l, n)
				}
				sum += l
				ss, err := c.ClusterKeySlot(ctx, key).Result()
				if err != nil && b.name == "cluster" {
					t.Fatal(err)
				}
				ds, _ := c.ClusterKeySlot(ctx, ShardDeadLetterKey(prefix, i)).Result()
				if b.name == "cluster" && ss != ds {
					t.Errorf("shard %d: stream slot %d, dead-letter slot %d", i, ss, ds)
				}
			}
			if depth, err := q.Depth(ctx); err != nil || depth != n || sum != n {
				t.Fatalf("Depth = %d, %v; streams hold %d; want %d", depth, err, sum, n)
			}
			if w, err := q.Waiting(ctx); err != nil || w != n {
				t.Fatalf("Waiting = %d, %v; want %d", w, err, n)
			}
			if b.name == "cluster" {
				cc := c.(*redis.ClusterClient)
				nodes := map[string]bool{}
				for _, key := range q.Streams() {
					node, err := cc.MasterForKey(ctx, key)
					if err != nil {
						t.Fatalf("the primary of %s: %v", key, err)
					}
					nodes[node.Options().Addr] = true
				}
				if len(nodes) < 2 {
					t.Errorf("4 shards on %d node(s), want them spread", len(nodes))
				}
			}
			// Dead letters of several shards are read back together. Jobs
			// are taken oldest first, then by shard: on a fast machine the
			// oldest millisecond may hold only shard 0's first jobs, so take
			// every job and dead-letter six spread over the shards.
			byShard := map[string][]failover.Delivery{}
			for _, d := range fetchAll(t, q, n) {
				s, _, _ := strings.Cut(d.ID, ":")
				byShard[s] = append(byShard[s], d)
			}
			var ds []failover.Delivery
			for k := 0; len(ds) < 6 && k < n; k++ {
				for _, s := range []string{"0", "1", "2", "3"} {
					if len(ds) < 6 && k < len(byShard[s]) {
						ds = append(ds, byShard[s][k])
					}
				}
			}
			for _, d := range ds {
				if err := q.DeadLetter(ctx, d, "x"); err != nil {
					t.Fatalf("DeadLetter %s: %v", d.ID, err)
				}
			}
			if dl, err := q.DeadLetterDepth(ctx); err != nil || dl != 6 {
				t.Fatalf("DeadLetterDepth = %d, %v; want 6", dl, err)
			}
			recs, err := q.DeadLetters(ctx, 100)
			if err != nil || len(recs) != 6 {
				t.Fatalf("DeadLetters = %d records, %v; want 6", len(recs), err)
			}
			shardsSeen := map[string]bool{}
			for _, r := range recs {
				s, _, _ := strings.Cut(r.ID, ":")
				shardsSeen[s] = true
			}
			if len(shardsSeen) < 2 {
				t.Errorf("6 dead letters from shards %v, want several", shardsSeen)
			}
			if depth, _ := q.Depth(ctx); depth != n-6 {
				t.Fatalf("Depth after 6 dead letters = %d, want %d", depth, n-6)
			}
		})
	}
}

// TestShardsReadInOrder: a consumer taking one or a few jobs at a time
// from a backlog spread over the shards takes it oldest first across
// them, so no shard waits behind another's backlog.
func TestShardsReadInOrder(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := b.client(t)
			ctx := ctxT(t, 20*time.Second)
			q := newShardedQueue(t, c, redistest.Prefix(t), "a", 4)
			const n = 24
			for i := range n {
				if err := q.Enqueue(ctx, fmt.Sprintf("req-%02d", i), fmt.Appendf(nil, "%02d", i)); err != nil {
					t.Fatal(err)
				}
				// Entries a millisecond or more apart: the order across
				// shards is by entry time.
				time.Sleep(2 * time.Millisecond)
			}
			shards := map[string]bool{}
			var got []string
			for len(got) < n {
				for _, d := range fetchAll(t, q, 1+len(got)%3) {
					s, _, _ := strings.Cut(d.ID, ":")
					shards[s] = true
					got = append(got, string(d.Body))
					if err := q.Ack(ctx, d); err != nil {
						t.Fatal(err)
					}
				}
			}
			for i, g := range got {
				if want := fmt.Sprintf("%02d", i); g != want {
					t.Fatalf("job %d fetched was %s, want %s (all: %v)", i, g, want, got)
				}
			}
			if len(shards) < 3 {
				t.Errorf("%d jobs came from shards %v only: not spread", n, shards)
			}
		})
	}
}

// TestShardedFetchWakesOnAnyShard: an idle consumer notices a job on any
// shard within a few ShardBlock rounds, not after Block.
func TestShardedFetchWakesOnAnyShard(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := b.client(t)
			ctx := ctxT(t, 20*time.Second)
			prefix := redistest.Prefix(t)
			q, err := New(Config{Prefix: prefix, Consumer: "a", Shards: 4, Block: 5 * time.Second, ShardBlock: 20 * time.Millisecond}, c)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan time.Duration, 8)
			go func() {
				for range 8 {
					ds, err := q.Fetch(ctx, 1)
					if err != nil {
						return
					}
					_ = q.Ack(ctx, ds[0])
					got <- 0
				}
			}()
			for i := range 8 {
				start := time.Now()
				if err := q.Enqueue(ctx, fmt.Sprintf("wake-%d", i), []byte("job")); err != nil {
					t.Fatal(err)
				}
				select {
				case <-got:
					if took := time.Since(start); took > 2*time.Second {
						t.Fatalf("job %d fetched after %s, want well under Block (5s)", i, took)
					}
				case <-ctx.Done():
					t.Fatalf("job %d never fetched", i)
				}
			}
		})
	}
}

// On a single Redis the jobs next.lua takes come with their cancel key
// looked up (failover.CancelKey with the queue's prefix), so the worker
// asks no more before calling the provider; on a Cluster the key is in
// another slot than the job's stream, so nothing is looked up and the
// worker asks itself, as before.
func TestTakenJobsCarryTheirCancelCheck(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			c := b.client(t)
			ctx := ctxT(t, 20*time.Second)
			prefix := redistest.Prefix(t)
			q, err := New(Config{Prefix: prefix, Consumer: "a"}, c)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"left-1", "here-1", "left-2"} {
				if err := q.Enqueue(ctx, id, []byte("job "+id)); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range []string{"left-1", "left-2"} {
				if err := c.Set(ctx, failover.CancelKey(prefix, id), "1", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			ds, err := q.Fetch(ctx, 3)
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) != 3 {
				t.Fatalf("fetched %d jobs, want 3", len(ds))
			}
			for _, d := range ds {
				id := strings.TrimPrefix(string(d.Body), "job ")
				wantChecked := b.name == "single"
				wantGone := wantChecked && strings.HasPrefix(id, "left-")
				if d.CancelChecked != wantChecked || d.Cancelled != wantGone {
					t.Errorf("job %s: CancelChecked %v Cancelled %v, want %v %v", id, d.CancelChecked, d.Cancelled, wantChecked, wantGone)
				}
				if err := q.Ack(ctx, d); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
