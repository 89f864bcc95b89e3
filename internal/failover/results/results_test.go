package results_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/testkit/memresults"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// halves is one implementation's api half and worker half.
type halves struct {
	sub interface {
		failover.ResultSubscriber
		failover.Canceller
	}
	pub interface {
		failover.ResultPublisher
		failover.CancelWatcher
	}
}

// checkChannel runs the behaviour both implementations share.
func checkChannel(t *testing.T, h halves, id string) {
	ctx := context.Background()
	sink := h.pub.ResultsFor(id)
	if heard, err := sink.Publish(ctx, []byte("early")); err != nil || heard {
		t.Fatalf("publish before any subscription: heard %v, %v; want nobody", heard, err)
	}
	sub, err := h.sub.SubscribeResults(ctx, id)
	if err != nil {
		t.Fatalf("SubscribeResults: %v", err)
	}
	for _, msg := range []string{"one", "two"} {
		if heard, err := sink.Publish(ctx, []byte(msg)); err != nil || !heard {
			t.Fatalf("publish %q: heard %v, %v; want the subscription", msg, heard, err)
		}
	}
	receive := func(wants ...string) {
		t.Helper()
		for _, want := range wants {
			select {
			case got := <-sub.C():
				if string(got) != want {
					t.Fatalf("received %q, want %q", got, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no %q within 5s", want)
			}
		}
	}
	receive("one", "two")
	// A worker's last batch and DONE: one write, in order (SPUBLISH on a
	// Cluster, to the channel's node).
	if heard, err := sink.PublishPair(ctx, []byte("three"), []byte("four")); err != nil || !heard {
		t.Fatalf("publish pair: heard %v, %v; want the subscription", heard, err)
	}
	receive("three", "four")
	sub.Close()
	sub.Close() // idempotent
	if sub.Err() != nil {
		t.Errorf("Err after Close = %v, want nil", sub.Err())
	}

	cancels, err := h.pub.WatchCancels(ctx)
	if err != nil {
		t.Fatalf("WatchCancels: %v", err)
	}
	defer cancels.Close()
	if gone, err := h.pub.Cancelled(ctx, id); err != nil || gone {
		t.Fatalf("Cancelled before Cancel = %v, %v", gone, err)
	}
	// The Redis watcher's SUBSCRIBE is not awaited: announce until heard.
	deadline := time.After(5 * time.Second)
	for heard := false; !heard; {
		if err := h.sub.Cancel(ctx, id, time.Minute); err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		select {
		case got := <-cancels.C():
			if got != id {
				t.Fatalf("cancel notice %q, want %q", got, id)
			}
			heard = true
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("cancel notice not heard within 5s")
		}
	}
	if gone, err := h.pub.Cancelled(ctx, id); err != nil || !gone {
		t.Fatalf("Cancelled after Cancel = %v, %v; want true", gone, err)
	}
	cancels.Close()
	for range cancels.C() { // C ends after Close
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	prefix := redistest.Prefix(t)
	sub, err := results.NewSubscriber(results.SubscriberConfig{Prefix: prefix}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub, err := results.NewPublisher(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	checkChannel(t, halves{sub: sub, pub: pub}, "req-1")
	ttl, err := rdb.TTL(context.Background(), failover.CancelKey(prefix, "req-1")).Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Errorf("cancel key TTL %v, %v; want at most a minute", ttl, err)
	}
}

func TestMemory(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		m, err := memresults.New(memresults.Config{Buffer: 2})
		if err != nil {
			t.Fatal(err)
		}
		checkChannel(t, halves{sub: m, pub: m}, "req-1")

		// The mark expires with its TTL.
		ctx := context.Background()
		if err := m.Cancel(ctx, "req-2", time.Second); err != nil {
			t.Fatal(err)
		}
		testutil.AdvanceFakeClock(time.Second) // the TTL under test
		if gone, _ := m.Cancelled(ctx, "req-2"); gone {
			t.Error("cancel mark outlived its TTL")
		}

		// A reader more than Buffer behind ends with ErrResultOverflow.
		sub, err := m.SubscribeResults(ctx, "slow")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.SubscribeResults(ctx, "slow"); !errors.Is(err, memresults.ErrDuplicate) {
			t.Errorf("second subscription: %v, want ErrMemoryDuplicate", err)
		}
		for range 3 {
			_, _ = m.PublishResult(ctx, "slow", []byte("x"))
		}
		<-sub.Done()
		if !errors.Is(sub.Err(), failover.ErrResultOverflow) {
			t.Errorf("Err = %v, want ErrResultOverflow", sub.Err())
		}
		if m.Subscribed("slow") {
			t.Error("overflowed subscription still open")
		}
	})
}

// TestRedisCluster runs the shared behaviour on a 3-primary Redis Cluster,
// for request ids whose channels live on every node, and checks that result
// channels are sharded: the node owning a channel's slot counts its
// subscriber in PUBSUB SHARDNUMSUB and nobody holds a classic subscription.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	rdb := cluster.Client(t)
	prefix := redistest.Prefix(t)
	sub, err := results.NewSubscriber(results.SubscriberConfig{Prefix: prefix}, rdb, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub, err := results.NewPublisher(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nodes := map[string]bool{}
	for i := 0; len(nodes) < len(cluster.Nodes); i++ {
		if i > 200 {
			t.Fatalf("request ids reached only nodes %v", nodes)
		}
		id := fmt.Sprintf("req-%d", i)
		channel := failover.ResultChannel(prefix, id)
		node, err := cluster.NodeFor(ctx, channel)
		if err != nil {
			t.Fatal(err)
		}
		if nodes[node] {
			continue
		}
		nodes[node] = true
		checkChannel(t, halves{sub: sub, pub: pub}, id)

		// Subscribed again, the channel must be a sharded one on its node.
		s, err := sub.SubscribeResults(ctx, id)
		if err != nil {
			t.Fatalf("SubscribeResults %s: %v", id, err)
		}
		nc := redis.NewClient(&redis.Options{Addr: node})
		sharded, err := nc.PubSubShardNumSub(ctx, channel).Result()
		classic, err2 := nc.PubSubNumSub(ctx, channel).Result()
		_ = nc.Close()
		if err != nil || err2 != nil {
			t.Fatalf("PUBSUB on %s: %v, %v", node, err, err2)
		}
		if sharded[channel] != 1 || classic[channel] != 0 {
			t.Errorf("%s on %s: %d sharded, %d classic subscribers; want 1 and 0", channel, node, sharded[channel], classic[channel])
		}
		s.Close()
	}
}
