package pubsub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

const within = 10 * time.Second

func newSubscriber(tb testing.TB, cfg Config, client redis.UniversalClient) *Subscriber {
	tb.Helper()
	s, err := New(cfg, client, nil)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

func mustSubscribe(tb testing.TB, s *Subscriber, channel string) *Subscription {
	tb.Helper()
	sub, err := s.Subscribe(context.Background(), channel)
	if err != nil {
		tb.Fatalf("Subscribe %s: %v", channel, err)
	}
	return sub
}

// receive returns the next payload, failing if none comes within d or the
// subscription ended first.
func receive(tb testing.TB, sub *Subscription, d time.Duration) string {
	tb.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case b, ok := <-sub.C():
		if !ok {
			tb.Fatalf("%s: subscription ended (err %v) while waiting for a message", sub.Channel(), sub.Err())
		}
		return string(b)
	case <-timer.C:
		tb.Fatalf("%s: no message within %v", sub.Channel(), d)
	}
	return ""
}

func publish(tb testing.TB, c redis.UniversalClient, channel, msg string) int64 {
	tb.Helper()
	n, err := c.Publish(context.Background(), channel, msg).Result()
	if err != nil {
		tb.Fatalf("PUBLISH %s: %v", channel, err)
	}
	return n
}

func numsub(tb testing.TB, c redis.UniversalClient, channel string) int64 {
	tb.Helper()
	m, err := c.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		tb.Fatalf("PUBSUB NUMSUB: %v", err)
	}
	return m[channel]
}

func waitDone(tb testing.TB, sub *Subscription, d time.Duration) {
	tb.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-sub.Done():
	case <-timer.C:
		tb.Fatalf("%s: Done not closed within %v", sub.Channel(), d)
	}
}

// channelsOnShard returns n channel names with prefix that map to the same
// shard as first.
func channelsOnShard(s *Subscriber, prefix string, n int) []string {
	out := make([]string, 0, n)
	var want *shard
	for i := 0; len(out) < n; i++ {
		ch := fmt.Sprintf("%s%d", prefix, i)
		if want == nil {
			want = mustShard(s, ch)
		}
		if mustShard(s, ch) == want {
			out = append(out, ch)
		}
	}
	return out
}

// mustShard is shardFor on one Redis, where it cannot fail.
func mustShard(s *Subscriber, channel string) *shard {
	sh, err := s.shardFor(context.Background(), channel)
	if err != nil {
		panic(err)
	}
	return sh
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero means defaults", Config{}, true},
		{"explicit", Config{Shards: 8, Buffer: 16, SubscribeTimeout: time.Second}, true},
		{"negative shards", Config{Shards: -1}, false},
		{"too many shards", Config{Shards: maxShards + 1}, false},
		{"negative buffer", Config{Buffer: -1}, false},
		{"huge buffer", Config{Buffer: maxBuffer + 1}, false},
		{"negative timeout", Config{SubscribeTimeout: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", tt.cfg, err, tt.ok)
			}
		})
	}
	d := Config{}.withDefaults()
	if d.Shards != DefaultShards || d.Buffer != DefaultBuffer || d.SubscribeTimeout != DefaultSubscribeTimeout {
		t.Fatalf("defaults = %+v", d)
	}
	if _, err := New(Config{Shards: -1}, redis.NewClient(&redis.Options{}), nil); err == nil {
		t.Fatal("New accepted an invalid config")
	}
}

// A message published right after Subscribe returns must arrive: Subscribe
// waits for Redis' confirmation, not just for the command to be written.
func TestSubscribeConfirmedBeforeReturn(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{}, srv.Client(t))
	prefix := redistest.Prefix(t)

	const workers, perWorker = 8, 250 // 2000 iterations
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				ch := fmt.Sprintf("%s%d:%d", prefix, w, i)
				sub, err := s.Subscribe(context.Background(), ch)
				if err != nil {
					t.Errorf("Subscribe: %v", err)
					return
				}
				n, err := pub.Publish(context.Background(), ch, "first").Result()
				if err != nil || n != 1 {
					t.Errorf("PUBLISH %s right after Subscribe = %d, %v; want 1 receiver", ch, n, err)
					sub.Close()
					return
				}
				timer := time.NewTimer(within)
				select {
				case got := <-sub.C():
					if string(got) != "first" {
						t.Errorf("%s: got %q", ch, got)
					}
				case <-timer.C:
					t.Errorf("%s: message published after Subscribe not received", ch)
				}
				timer.Stop()
				sub.Close()
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Routed != workers*perWorker || st.Active != 0 {
		t.Fatalf("stats = %+v, want %d routed and none active", st, workers*perWorker)
	}
}

func TestSubscriptionsAreIsolated(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{}, srv.Client(t))
	prefix := redistest.Prefix(t)

	const nSubs, nMsgs, publishers = 1000, 20, 8
	subs := make([]*Subscription, nSubs)
	var wg sync.WaitGroup
	for i := range subs {
		wg.Go(func() {
			sub, err := s.Subscribe(context.Background(), fmt.Sprintf("%s%d", prefix, i))
			if err != nil {
				t.Errorf("Subscribe %d: %v", i, err)
				return
			}
			subs[i] = sub
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	defer func() {
		for _, sub := range subs {
			sub.Close()
		}
	}()

	// Each publisher owns a set of channels and publishes round by round, so
	// messages of different channels interleave while each channel's
	// messages keep one publisher's order.
	for p := range publishers {
		wg.Go(func() {
			for r := range nMsgs {
				for i := p; i < nSubs; i += publishers {
					msg := fmt.Sprintf("%s|%d", subs[i].Channel(), r)
					if n, err := pub.Publish(context.Background(), subs[i].Channel(), msg).Result(); err != nil || n != 1 {
						t.Errorf("PUBLISH %s = %d, %v", subs[i].Channel(), n, err)
						return
					}
				}
			}
		})
	}
	for _, sub := range subs {
		wg.Go(func() {
			for r := range nMsgs {
				timer := time.NewTimer(within)
				select {
				case b, ok := <-sub.C():
					want := fmt.Sprintf("%s|%d", sub.Channel(), r)
					if !ok || string(b) != want {
						t.Errorf("%s message %d = %q (open %v), want %q", sub.Channel(), r, b, ok, want)
						timer.Stop()
						return
					}
				case <-timer.C:
					t.Errorf("%s: message %d not received", sub.Channel(), r)
					return
				}
				timer.Stop()
			}
		})
	}
	wg.Wait()
	// Every PUBLISH had exactly one receiver and exactly nSubs*nMsgs were
	// routed, so no subscription got a message beyond its own.
	st := s.Stats()
	if st.Routed != nSubs*nMsgs || st.DroppedUnknown != 0 || st.Overflows != 0 {
		t.Fatalf("stats = %+v, want %d routed, nothing dropped", st, nSubs*nMsgs)
	}
	for _, sub := range subs {
		if n := len(sub.C()); n != 0 {
			t.Fatalf("%s has %d extra messages", sub.Channel(), n)
		}
	}
}

// One api uses Shards connections however many requests wait.
func TestConnectionCountIsShards(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	s := newSubscriber(t, Config{Shards: 4}, srv.Client(t))
	prefix := redistest.Prefix(t)

	// No I/O before the first Subscribe, and one connection for one shard.
	first := mustSubscribe(t, s, prefix+"first")
	defer first.Close()
	if n := pubsubClients(t, admin); n != 1 {
		t.Fatalf("after one Subscribe: %d pubsub connections, want 1", n)
	}
	if n := clients(t, admin, "normal"); n != 1 { // admin itself
		t.Fatalf("after one Subscribe: %d other connections, want only admin's", n)
	}

	const n = 2000
	subs := make([]*Subscription, n)
	var wg sync.WaitGroup
	for i := range subs {
		wg.Go(func() { subs[i] = mustSubscribe(t, s, fmt.Sprintf("%s%d", prefix, i)) })
	}
	wg.Wait()
	defer func() {
		for _, sub := range subs {
			if sub != nil {
				sub.Close()
			}
		}
	}()
	if got := pubsubClients(t, admin); got != 4 {
		t.Fatalf("CLIENT LIST TYPE pubsub: %d connections, want 4", got)
	}
	chans, err := admin.PubSubChannels(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(chans) != n+1 {
		t.Fatalf("PUBSUB CHANNELS: %d, want %d", len(chans), n+1)
	}
	if st := s.Stats(); st.Active != n+1 {
		t.Fatalf("Active = %d, want %d", st.Active, n+1)
	}
}

func pubsubClients(tb testing.TB, c *redis.Client) int {
	tb.Helper()
	return clients(tb, c, "pubsub")
}

func clients(tb testing.TB, c *redis.Client, typ string) int {
	tb.Helper()
	out, err := c.Do(context.Background(), "CLIENT", "LIST", "TYPE", typ).Text()
	if err != nil {
		tb.Fatalf("CLIENT LIST: %v", err)
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	return n
}

func TestCloseUnsubscribes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{}, srv.Client(t))
	prefix := redistest.Prefix(t)

	sub := mustSubscribe(t, s, prefix+"a")
	publish(t, pub, sub.Channel(), "before")
	if got := receive(t, sub, within); got != "before" {
		t.Fatalf("got %q", got)
	}
	sub.Close()
	sub.Close() // idempotent
	testutil.Eventually(t, within, func() bool { return numsub(t, pub, sub.Channel()) == 0 }, "NUMSUB 0 after Close")
	if sub.Err() != nil {
		t.Fatalf("Err after Close = %v, want nil", sub.Err())
	}
	select {
	case <-sub.Done():
		t.Fatal("Done closed by Close")
	default:
	}
	if _, ok := <-sub.C(); ok {
		t.Fatal("C delivered after Close")
	}

	// A message racing the UNSUBSCRIBE reaches the reader after Close
	// removed the subscription: it must be counted, never delivered.
	var delivered atomic.Int64
	var raced uint64
	for i := 0; i < 200 && raced < 5; i++ {
		sub := mustSubscribe(t, s, fmt.Sprintf("%srace%d", prefix, i))
		sub.Close()
		raced += uint64(publish(t, pub, sub.Channel(), "late"))
		for range sub.C() {
			delivered.Add(1)
		}
	}
	t.Logf("%d PUBLISH raced the UNSUBSCRIBE", raced)
	testutil.Eventually(t, within, func() bool { return s.Stats().DroppedUnknown == raced }, "late messages counted as dropped")
	if d := delivered.Load(); d != 0 {
		t.Fatalf("%d messages delivered after Close", d)
	}
	if st := s.Stats(); st.Routed != 1 || st.Active != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestOverflowEndsOnlySlowSubscription(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{Buffer: 4}, srv.Client(t))
	chans := channelsOnShard(s, redistest.Prefix(t), 2)
	slow := mustSubscribe(t, s, chans[0])
	defer slow.Close()
	fast := mustSubscribe(t, s, chans[1])
	defer fast.Close()

	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 100 {
			pub.Publish(context.Background(), slow.Channel(), fmt.Sprint(i))
		}
	})
	for i := range 100 {
		publish(t, pub, fast.Channel(), fmt.Sprint(i))
		if got := receive(t, fast, within); got != fmt.Sprint(i) {
			t.Fatalf("fast got %q, want %d", got, i)
		}
	}
	wg.Wait()

	waitDone(t, slow, within)
	if !errors.Is(slow.Err(), ErrOverflow) {
		t.Fatalf("slow Err = %v, want ErrOverflow", slow.Err())
	}
	// What was buffered before the overflow is still readable, in order.
	var got []string
	for b := range slow.C() {
		got = append(got, string(b))
	}
	if strings.Join(got, ",") != "0,1,2,3" {
		t.Fatalf("slow buffered %v, want the first 4", got)
	}
	select {
	case <-fast.Done():
		t.Fatalf("fast subscription ended: %v", fast.Err())
	default:
	}
	testutil.Eventually(t, within, func() bool { return numsub(t, pub, slow.Channel()) == 0 }, "overflowed channel unsubscribed")
	if st := s.Stats(); st.Overflows != 1 || st.Active != 1 {
		t.Fatalf("stats = %+v, want 1 overflow, 1 active", st)
	}
}

func TestConnectionLossEndsSubscriptions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{SubscribeTimeout: 2 * time.Second}, srv.Client(t))
	prefix := redistest.Prefix(t)

	subs := make([]*Subscription, 200)
	shards := map[*shard]bool{}
	for i := range subs {
		subs[i] = mustSubscribe(t, s, fmt.Sprintf("%s%d", prefix, i))
		shards[mustShard(s, subs[i].Channel())] = true
	}
	publish(t, pub, subs[0].Channel(), "x")
	receive(t, subs[0], within)

	srv.Stop()
	for _, sub := range subs {
		waitDone(t, sub, within)
		if !errors.Is(sub.Err(), ErrConnectionLost) {
			t.Fatalf("%s: Err = %v, want ErrConnectionLost", sub.Channel(), sub.Err())
		}
	}
	st := s.Stats()
	if st.ConnectionLosses != uint64(len(shards)) || st.Active != 0 {
		t.Fatalf("stats = %+v, want %d losses, none active", st, len(shards))
	}

	// While Redis is down Subscribe fails fast instead of hanging.
	start := time.Now()
	_, err := s.Subscribe(context.Background(), prefix+"down")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Subscribe while down: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Subscribe while down took %v", d)
	}

	srv.Restart(t)
	for i := range 20 { // every shard, most likely, comes back
		sub := mustSubscribe(t, s, fmt.Sprintf("%sback%d", prefix, i))
		if n := publish(t, pub, sub.Channel(), "again"); n != 1 {
			t.Fatalf("PUBLISH after restart reached %d subscribers", n)
		}
		if got := receive(t, sub, within); got != "again" {
			t.Fatalf("after restart got %q", got)
		}
		sub.Close()
	}
}

// A connection killed while Redis stays up is re-established by go-redis
// behind our back; the subscriptions on it must still end (messages were
// lost in the gap) and the channels it resubscribed must not linger.
func TestKilledConnectionEndsSubscriptions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	s := newSubscriber(t, Config{}, srv.Client(t))
	prefix := redistest.Prefix(t)

	subs := make([]*Subscription, 100)
	shards := map[*shard]bool{}
	for i := range subs {
		subs[i] = mustSubscribe(t, s, fmt.Sprintf("%s%d", prefix, i))
		shards[mustShard(s, subs[i].Channel())] = true
	}
	if err := admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL: %v", err)
	}
	for _, sub := range subs {
		waitDone(t, sub, within)
		if !errors.Is(sub.Err(), ErrConnectionLost) {
			t.Fatalf("Err = %v, want ErrConnectionLost", sub.Err())
		}
	}
	if st := s.Stats(); st.ConnectionLosses != uint64(len(shards)) {
		t.Fatalf("stats = %+v, want %d losses", st, len(shards))
	}
	testutil.Eventually(t, within, func() bool {
		chans, err := admin.PubSubChannels(context.Background(), prefix+"*").Result()
		return err == nil && len(chans) == 0
	}, "resubscribed channels dropped")

	sub := mustSubscribe(t, s, prefix+"after")
	defer sub.Close()
	if n := publish(t, admin, sub.Channel(), "ok"); n != 1 {
		t.Fatalf("PUBLISH after kill reached %d", n)
	}
	if got := receive(t, sub, within); got != "ok" {
		t.Fatalf("got %q", got)
	}
}

// A connection that stops answering without being closed (host gone, no
// RST) is found by the health ping and ends the subscriptions.
func TestSilentConnectionEndsSubscriptions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	px := startProxy(t, srv.Addr)
	s := newSubscriber(t, Config{Shards: 1}, redisClient(t, px.addr))
	s.healthInterval = 400 * time.Millisecond
	prefix := redistest.Prefix(t)

	sub := mustSubscribe(t, s, prefix+"a")
	publish(t, pub, sub.Channel(), "x")
	receive(t, sub, within)
	// Idle for several health intervals: pings keep the subscription.
	idle := time.NewTimer(3 * s.healthInterval)
	select {
	case <-sub.Done():
		t.Fatalf("ended while healthy: %v", sub.Err())
	case <-idle.C:
	}

	px.freeze()
	waitDone(t, sub, within)
	if !errors.Is(sub.Err(), ErrConnectionLost) {
		t.Fatalf("Err = %v, want ErrConnectionLost", sub.Err())
	}
	if st := s.Stats(); st.ConnectionLosses != 1 {
		t.Fatalf("stats = %+v, want 1 loss", st)
	}
}

func TestSubscribeDuplicate(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{}, srv.Client(t))
	ch := redistest.Prefix(t) + "dup"

	sub := mustSubscribe(t, s, ch)
	if _, err := s.Subscribe(context.Background(), ch); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("second Subscribe: %v, want ErrDuplicate", err)
	}
	publish(t, pub, ch, "still")
	if got := receive(t, sub, within); got != "still" {
		t.Fatalf("got %q", got)
	}
	sub.Close()
	// Closed channels can be subscribed again, and the late replies of the
	// old subscription do not confuse the new one.
	for i := range 50 {
		again := mustSubscribe(t, s, ch)
		if n := publish(t, pub, ch, fmt.Sprint(i)); n != 1 {
			t.Fatalf("resubscribe %d: PUBLISH reached %d", i, n)
		}
		if got := receive(t, again, within); got != fmt.Sprint(i) {
			t.Fatalf("resubscribe %d: got %q", i, got)
		}
		again.Close()
	}
}

func TestSubscribeCancelledContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s := newSubscriber(t, Config{}, srv.Client(t))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Subscribe(ctx, redistest.Prefix(t)+"x")
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Subscribe(cancelled) = %v", err)
	}
	if st := s.Stats(); st.Active != 0 {
		t.Fatalf("Active = %d after failed Subscribe", st.Active)
	}
}

// Against a server that never answers, Subscribe is bounded by ctx and by
// SubscribeTimeout, and leaves nothing registered.
func TestSubscribeBoundedWhenRedisHangs(t *testing.T) {
	t.Parallel()
	addr := startBlackhole(t)
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s := newSubscriber(t, Config{SubscribeTimeout: 3 * time.Second}, c)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Subscribe(ctx, "a")
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Subscribe = %v", err)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Fatalf("Subscribe returned after %v, ctx allowed 100ms", d)
	}

	s2 := newSubscriber(t, Config{SubscribeTimeout: 200 * time.Millisecond}, c)
	start = time.Now()
	if _, err := s2.Subscribe(context.Background(), "b"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Subscribe = %v", err)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Fatalf("Subscribe returned after %v, SubscribeTimeout 200ms", d)
	}
	if a, b := s.Stats().Active, s2.Stats().Active; a != 0 || b != 0 {
		t.Fatalf("Active = %d, %d after failed Subscribe", a, b)
	}
}

func TestCloseEndsSubscriptions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	s, err := New(Config{}, srv.Client(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	prefix := redistest.Prefix(t)
	subs := make([]*Subscription, 50)
	for i := range subs {
		subs[i] = mustSubscribe(t, s, fmt.Sprintf("%s%d", prefix, i))
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, sub := range subs {
		waitDone(t, sub, within)
		if !errors.Is(sub.Err(), ErrClosed) {
			t.Fatalf("Err = %v, want ErrClosed", sub.Err())
		}
		sub.Close()
	}
	if _, err := s.Subscribe(context.Background(), prefix+"late"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe after Close = %v", err)
	}
	testutil.Eventually(t, within, func() bool { return pubsubClients(t, admin) == 0 }, "pubsub connections closed")
	// The client was handed in, so it stays open.
	if err := admin.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// Thousands of goroutines subscribing and closing at once, with messages
// flowing, leave nothing behind.
func TestConcurrentSubscribeClose(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{}, srv.Client(t))
	prefix := redistest.Prefix(t)

	var wg sync.WaitGroup
	for i := range 3000 {
		wg.Go(func() {
			sub, err := s.Subscribe(context.Background(), fmt.Sprintf("%s%d", prefix, i))
			if err != nil {
				t.Errorf("Subscribe: %v", err)
				return
			}
			if i%3 == 0 {
				pub.Publish(context.Background(), sub.Channel(), "m")
				receive(t, sub, within)
			}
			sub.Close()
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Active != 0 || st.Routed != 1000 {
		t.Fatalf("stats = %+v", st)
	}
	testutil.Eventually(t, within, func() bool {
		chans, err := pub.PubSubChannels(context.Background(), prefix+"*").Result()
		return err == nil && len(chans) == 0
	}, "all channels unsubscribed")
}

// A channel subscribed again after a subscription that Redis had not yet
// confirmed gets the old SUBSCRIBE's reply first: it must not count as the
// new confirmation. White-box: the shard's reply handling is driven by hand,
// without its goroutines, in the order Redis answers.
func TestStaleRepliesDoNotConfirmReusedChannel(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = c.Close() })
	s := &Subscriber{cfg: Config{}.withDefaults(), client: c, log: testutil.DiscardLogger()}
	sh := newShard(s, 0, c, "", false)
	ps := sh.ps
	t.Cleanup(func() { _ = ps.Close() })
	confirmed := func(sub *Subscription) bool {
		select {
		case <-sub.confirmed:
			return true
		default:
			return false
		}
	}

	first, _, err := sh.register("x")
	if err != nil {
		t.Fatal(err)
	}
	first.Close() // its SUBSCRIBE is still unanswered
	second, _, err := sh.register("x")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []opKind
	for _, o := range sh.ops {
		kinds = append(kinds, o.kind)
	}
	if fmt.Sprint(kinds) != fmt.Sprint([]opKind{opSubscribe, opUnsubscribe, opSubscribe}) {
		t.Fatalf("queued ops %v", sh.ops)
	}

	sh.confirm(ps, "x") // reply to first's SUBSCRIBE
	sh.route(ps, "x", "old")
	if confirmed(second) || len(second.C()) != 0 {
		t.Fatal("reply or message of the earlier subscription reached the new one")
	}
	sh.unsubscribed(ps, "x")
	if confirmed(second) {
		t.Fatal("confirmed by UNSUBSCRIBE reply")
	}
	sh.confirm(ps, "x")
	if !confirmed(second) {
		t.Fatal("own SUBSCRIBE reply did not confirm")
	}
	sh.route(ps, "x", "new")
	if got := <-second.C(); string(got) != "new" {
		t.Fatalf("got %q", got)
	}
	if st := s.Stats(); st.DroppedUnknown != 1 || st.Routed != 1 || st.Active != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

// miniredis is a fast extra check of the wiring, not evidence for timing.
func TestMiniredis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	c := redisClient(t, m.Addr())
	s := newSubscriber(t, Config{}, c)
	for i := range 20 {
		ch := fmt.Sprintf("results:%d", i)
		sub := mustSubscribe(t, s, ch)
		if n := m.Publish(ch, "hello"); n != 1 {
			t.Fatalf("publish reached %d", n)
		}
		if got := receive(t, sub, within); got != "hello" {
			t.Fatalf("got %q", got)
		}
		sub.Close()
		testutil.Eventually(t, within, func() bool { return m.PubSubNumSub(ch)[ch] == 0 }, "unsubscribed")
	}
}

func redisClient(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// startBlackhole listens on a free port and reads everything it is sent
// without ever answering.
func startBlackhole(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(io.Discard, conn) })
		}
	})
	tb.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// proxy forwards TCP to a Redis server until frozen; then it keeps the
// connections open but forwards nothing, like a peer that vanished.
type proxy struct {
	addr   string
	frozen atomic.Bool
}

func (p *proxy) freeze() { p.frozen.Store(true) }

func startProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !p.frozen.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { pipe(out, in) })
			wg.Go(func() { pipe(in, out) })
		}
	})
	tb.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// Reset (a Sentinel failover) ends every open subscription with
// ErrConnectionLost and later subscriptions work on fresh connections.
func TestResetEndsSubscriptions(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	s := newSubscriber(t, Config{SubscribeTimeout: 2 * time.Second}, srv.Client(t))
	prefix := redistest.Prefix(t)
	subs := make([]*Subscription, 20)
	for i := range subs {
		subs[i] = mustSubscribe(t, s, fmt.Sprintf("%s%d", prefix, i))
	}
	s.Reset(errors.New("primary switched"))
	for _, sub := range subs {
		waitDone(t, sub, within)
		if !errors.Is(sub.Err(), ErrConnectionLost) {
			t.Fatalf("%s: Err = %v, want ErrConnectionLost", sub.Channel(), sub.Err())
		}
	}
	if st := s.Stats(); st.Active != 0 {
		t.Fatalf("stats %+v after Reset, want none active", st)
	}
	sub := mustSubscribe(t, s, prefix+"after")
	if n := publish(t, pub, sub.Channel(), "fresh"); n != 1 {
		t.Fatalf("PUBLISH after Reset reached %d subscribers", n)
	}
	if got := receive(t, sub, within); got != "fresh" {
		t.Fatalf("after Reset got %q", got)
	}
}

// OnReady is called once, at the first payload, and a subscription that
// waited has no buffer until then; on a subscription that ended, or has a
// payload already, it is called at once.
func TestOnReady(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	s := newSubscriber(t, Config{Shards: 1}, client)
	sub := mustSubscribe(t, s, "ready-1")
	var calls atomic.Int32
	sub.OnReady(func() { calls.Add(1) })
	s.shards[0].mu.Lock()
	buffered := sub.c != nil
	s.shards[0].mu.Unlock()
	if calls.Load() != 0 || buffered {
		t.Fatalf("before any payload: %d calls, buffer made %v; want 0, false", calls.Load(), buffered)
	}
	publish(t, client, "ready-1", "one")
	publish(t, client, "ready-1", "two")
	testutil.Eventually(t, within, func() bool { return calls.Load() == 1 }, "OnReady not called at the first payload")
	if got := receive(t, sub, within); got != "one" {
		t.Fatalf("first payload %q", got)
	}
	if got := receive(t, sub, within); got != "two" {
		t.Fatalf("second payload %q", got)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("OnReady called %d times, want once", n)
	}

	// Registered late: a payload waits already, or the subscription ended.
	late := mustSubscribe(t, s, "ready-2")
	publish(t, client, "ready-2", "x")
	testutil.Eventually(t, within, func() bool {
		s.shards[0].mu.Lock()
		defer s.shards[0].mu.Unlock()
		return len(late.c) == 1
	}, "payload not buffered")
	var lateCalls atomic.Int32
	late.OnReady(func() { lateCalls.Add(1) })
	if lateCalls.Load() != 1 {
		t.Fatal("OnReady after a payload arrived was not called at once")
	}
	ended := mustSubscribe(t, s, "ready-3")
	ended.Close()
	var endedCalls atomic.Int32
	ended.OnReady(func() { endedCalls.Add(1) })
	if endedCalls.Load() != 1 {
		t.Fatal("OnReady on an ended subscription was not called at once")
	}
	if _, ok := <-ended.C(); ok {
		t.Fatal("ended subscription's C delivered a payload")
	}
}

// TestSubscribeSentByCallerOnLiveConnection: on a live connection that
// nobody is writing to, Subscribe sends its own SUBSCRIBE, so it is
// confirmed (and then receives) with the shard's writer not running; on a
// connection not live yet the SUBSCRIBE is left to the writer, which
// connects.
func TestSubscribeSentByCallerOnLiveConnection(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	pub := srv.Client(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	s := &Subscriber{cfg: Config{}.withDefaults(), client: c, log: testutil.DiscardLogger(),
		healthInterval: healthInterval, quit: make(chan struct{})}
	sh := newShard(s, 0, c, "", false)
	s.shards = []*shard{sh}
	s.wg.Add(1)
	go sh.readLoop() // the reader only: nothing runs writeLoop
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})

	first, send, err := sh.register(prefix + "first")
	if err != nil {
		t.Fatal(err)
	}
	if send {
		t.Fatal("register on a connection not live yet asked its caller to send")
	}
	// What the writer would do: send the queue, which connects.
	sh.mu.Lock()
	sh.writing = true
	sh.mu.Unlock()
	sh.sendQueued()
	select {
	case <-first.confirmed:
	case <-time.After(within):
		t.Fatal("first subscription not confirmed")
	}

	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	ch := prefix + "second"
	second, err := s.Subscribe(ctx, ch)
	if err != nil {
		t.Fatalf("Subscribe with no writer running: %v", err)
	}
	defer second.Close()
	if n, err := pub.Publish(ctx, ch, "hello").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH = %d, %v; want 1 receiver", n, err)
	}
	select {
	case got := <-second.C():
		if string(got) != "hello" {
			t.Fatalf("got %q", got)
		}
	case <-ctx.Done():
		t.Fatal("message not received")
	}
	sh.mu.Lock()
	writing, queued := sh.writing, len(sh.ops)
	sh.mu.Unlock()
	if writing || queued != 0 {
		t.Fatalf("after the caller's send: writing %v, %d ops queued; want neither", writing, queued)
	}
}
