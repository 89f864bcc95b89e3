package pubsub

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

func spublish(tb testing.TB, c redis.UniversalClient, channel, msg string) int64 {
	tb.Helper()
	n, err := c.SPublish(context.Background(), channel, msg).Result()
	if err != nil {
		tb.Fatalf("SPUBLISH %s: %v", channel, err)
	}
	return n
}

// channelsByNode returns, for each node of the cluster, one channel name
// with prefix (and a request-id hash tag) that the node serves.
func channelsByNode(tb testing.TB, c *redistest.Cluster, prefix string) map[string]string {
	tb.Helper()
	out := map[string]string{}
	for i := 0; len(out) < len(c.Nodes); i++ {
		if i > 500 {
			tb.Fatalf("channels reached only %d nodes", len(out))
		}
		ch := fmt.Sprintf("%sresults:{req-%d}", prefix, i)
		node, err := c.NodeFor(context.Background(), ch)
		if err != nil {
			tb.Fatal(err)
		}
		if _, ok := out[node]; !ok {
			out[node] = ch
		}
	}
	return out
}

// TestClusterSharded: on a cluster every channel is SSUBSCRIBEd on the
// primary owning its slot, with a set of shards per node, and receives
// what SPUBLISH sends; the slot function agrees with CLUSTER KEYSLOT.
func TestClusterSharded(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	cc := cluster.Client(t)
	ctx := context.Background()
	for _, k := range []string{"a", "queue:results:{req-1}", "x{}y", "{user1000}.following", "foo{bar}{zap}", "{", "é"} {
		want, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, CLUSTER KEYSLOT = %d", k, got, want)
		}
	}

	s := newSubscriber(t, Config{Shards: 2, SubscribeTimeout: 5 * time.Second}, cc)
	prefix := redistest.Prefix(t)
	var subs []*Subscription
	for i := range 60 {
		subs = append(subs, mustSubscribe(t, s, fmt.Sprintf("%sresults:{r%d}", prefix, i)))
	}
	s.mu.Lock()
	groups := len(s.groups)
	s.mu.Unlock()
	if groups != len(cluster.Nodes) {
		t.Errorf("%d node groups, want one per primary (%d)", groups, len(cluster.Nodes))
	}
	for _, sub := range subs {
		if n := spublish(t, cc, sub.Channel(), "hello "+sub.Channel()); n != 1 {
			t.Fatalf("SPUBLISH %s reached %d subscribers, want 1", sub.Channel(), n)
		}
	}
	for _, sub := range subs {
		if got := receive(t, sub, within); got != "hello "+sub.Channel() {
			t.Fatalf("%s got %q", sub.Channel(), got)
		}
		sub.Close()
	}
	if st := s.Stats(); st.Routed != uint64(len(subs)) || st.Active != 0 {
		t.Errorf("stats %+v, want %d routed and none active", st, len(subs))
	}
}

// TestClusterSlotMove: when a subscribed channel's slot moves to another
// primary, Redis drops the sharded subscription and it ends with ErrMoved
// (never a silent hang); a new subscription of that slot, tried first on
// the old owner (the client's slot map is stale), gets MOVED and is made
// on the new owner; a node that dies ends exactly its own subscriptions.
func TestClusterSlotMove(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	cc := cluster.Client(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	byNode := channelsByNode(t, cluster, prefix)
	s := newSubscriber(t, Config{SubscribeTimeout: 5 * time.Second}, cc)

	subs := map[string]*Subscription{}
	for node, ch := range byNode {
		subs[node] = mustSubscribe(t, s, ch)
	}

	// Move the slot of the first node's channel to the second node.
	from, to := cluster.Addrs[0], cluster.Addrs[1]
	moving := subs[from]
	slot := keySlot(moving.Channel())
	fromC := redis.NewClient(&redis.Options{Addr: from})
	toC := redis.NewClient(&redis.Options{Addr: to})
	t.Cleanup(func() { _, _ = fromC.Close(), toC.Close() })
	fromID, err := fromC.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	toID, err := toC.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		c    *redis.Client
		args []any
	}{
		{toC, []any{"CLUSTER", "SETSLOT", slot, "IMPORTING", fromID}},
		{fromC, []any{"CLUSTER", "SETSLOT", slot, "MIGRATING", toID}},
		{toC, []any{"CLUSTER", "SETSLOT", slot, "NODE", toID}},
		{fromC, []any{"CLUSTER", "SETSLOT", slot, "NODE", toID}},
	} {
		if err := step.c.Do(ctx, step.args...).Err(); err != nil {
			t.Fatalf("%v: %v", step.args, err)
		}
	}

	waitDone(t, moving, within)
	if !errors.Is(moving.Err(), ErrMoved) {
		t.Fatalf("moved subscription ended with %v, want ErrMoved", moving.Err())
	}
	// Another request id in the same slot: the client still maps the slot
	// to the old owner, which answers MOVED.
	var again string
	for i := 0; again == ""; i++ {
		if ch := fmt.Sprintf("%sresults:{m%d}", prefix, i); keySlot(ch) == slot {
			again = ch
		}
	}
	sub := mustSubscribe(t, s, again)
	if got := mustShard(s, again).node; got != to {
		t.Errorf("resubscribed on %s, want the slot's new owner %s", got, to)
	}
	if n := spublish(t, cc, again, "after move"); n != 1 {
		t.Fatalf("SPUBLISH after the move reached %d subscribers", n)
	}
	if got := receive(t, sub, within); got != "after move" {
		t.Fatalf("after the move got %q", got)
	}
	// The MOVED reply was handled as a redirection, not as a broken
	// connection ending the other subscriptions of its shard.
	if st := s.Stats(); st.ConnectionLosses != 0 {
		t.Errorf("stats %+v: the move counted as a connection loss", st)
	}

	// A dead node ends its own subscriptions only.
	victim := cluster.Addrs[2]
	cluster.Nodes[2].Stop()
	waitDone(t, subs[victim], within)
	if !errors.Is(subs[victim].Err(), ErrConnectionLost) {
		t.Fatalf("subscription on the dead node ended with %v, want ErrConnectionLost", subs[victim].Err())
	}
	if n := spublish(t, cc, subs[to].Channel(), "still here"); n != 1 {
		t.Fatalf("SPUBLISH on a live node reached %d subscribers", n)
	}
	if got := receive(t, subs[to], within); got != "still here" {
		t.Fatalf("live node's subscription got %q", got)
	}
}

func TestMovedSlot(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]int{
		"MOVED 5443 127.0.0.1:36307": 5443,
		"ASK 0 10.0.0.1:6379":        0,
		"MOVED 16384 x:1":            -1,
		"MOVED -1 x:1":               -1,
		"MOVED abc x:1":              -1,
		"MOVED":                      -1,
		"ERR unknown command":        -1,
	} {
		if got := movedSlot(errors.New(msg)); got != want {
			t.Errorf("movedSlot(%q) = %d, want %d", msg, got, want)
		}
	}
}
