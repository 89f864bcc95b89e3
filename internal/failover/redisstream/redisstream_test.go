package redisstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/failovertest"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// testIdle is the takeover time of the tests' queues: long enough that a
// test holding deliveries on a loaded machine (a fetch is one Lua call,
// which miniredis runs slowly under -race) does not see them taken over
// before it settles them, short enough to keep takeover tests quick.
const testIdle = time.Second

func newQueue(tb testing.TB, client redis.UniversalClient, prefix, consumer string) *Queue {
	tb.Helper()
	// The contract suite checks a dead letter's body: keep it.
	q, err := New(Config{Prefix: prefix, Consumer: consumer, ReclaimIdle: testIdle, KeepPayload: true}, client)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return q
}

func newShardedQueue(tb testing.TB, client redis.UniversalClient, prefix, consumer string, shards int) *Queue {
	tb.Helper()
	// The contract suite checks a dead letter's body: keep it.
	q, err := New(Config{Prefix: prefix, Consumer: consumer, ReclaimIdle: testIdle, Shards: shards, KeepPayload: true}, client)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return q
}

func harness(t testing.TB, client redis.UniversalClient) failovertest.Harness {
	return shardedHarness(t, client, 1)
}

func shardedHarness(t testing.TB, client redis.UniversalClient, shards int) failovertest.Harness {
	prefix := redistest.Prefix(t)
	producer := newShardedQueue(t, client, prefix, "producer", shards)
	return failovertest.Harness{
		Producer:    producer,
		Depth:       producer,
		NewConsumer: func(name string) failover.Consumer { return newShardedQueue(t, client, prefix, name, shards) },
		ReclaimIdle: testIdle,
		Unordered:   shards > 1,
		DeadLetters: func(ctx context.Context) ([]failover.DeadLetter, error) { return producer.DeadLetters(ctx, 1<<20) },
	}
}

// TestSuiteRedis is the evidence: a real redis-server and a real 3-node
// Redis Cluster, with the queue in one stream and split over four.
func TestSuiteRedis(t *testing.T) {
	for _, b := range backends(t) {
		for _, shards := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/shards=%d", b.name, shards), func(t *testing.T) {
				t.Parallel()
				failovertest.Run(t, func(t *testing.T) failovertest.Harness {
					return shardedHarness(t, b.client(t), shards)
				})
			})
		}
	}
}

// TestSuiteMiniredis keeps the embedded mode's backend honest.
func TestSuiteMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	failovertest.Run(t, func(t *testing.T) failovertest.Harness {
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return harness(t, c)
	})
}

// The settings' ranges are *bounds.Errors naming the field, every one
// reported; the edges pass.
func TestConfigBounds(t *testing.T) {
	t.Parallel()
	edge := Config{Consumer: "c", Shards: MaxShards, DeadLetterMaxLen: 1, DeadLetterTTL: time.Second, PriorityAging: time.Millisecond}.withDefaults()
	if err := edge.Validate(); err != nil {
		t.Errorf("edge values: %v", err)
	}
	for _, tc := range []struct {
		field string
		cfg   Config
	}{
		{"Shards", Config{Shards: MaxShards + 1}},
		{"Shards", Config{Shards: -1}},
		{"DeadLetterMaxLen", Config{DeadLetterMaxLen: -1}},
		{"DeadLetterTTL", Config{DeadLetterTTL: -time.Second}},
		{"PriorityAging", Config{PriorityAging: -time.Millisecond}},
	} {
		tc.cfg.Consumer = "c"
		err := tc.cfg.withDefaults().Validate()
		if got := bounds.Errors(err); len(got) != 1 || got[0].Field != tc.field {
			t.Errorf("Validate(%+v) = %v, want one bounds error for %s", tc.cfg, err, tc.field)
		}
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Consumer: "c"}, true},
		{"all set", Config{Prefix: "{q}:", Group: "g", Consumer: "c", Block: time.Millisecond, ReclaimIdle: time.Second, ReclaimInterval: 10 * time.Millisecond}, true},
		{"no consumer", Config{}, false},
		{"negative block", Config{Consumer: "c", Block: -1}, false},
		{"sub-millisecond block", Config{Consumer: "c", Block: time.Microsecond}, false},
		{"negative idle", Config{Consumer: "c", ReclaimIdle: -time.Second}, false},
		{"sub-millisecond idle", Config{Consumer: "c", ReclaimIdle: time.Microsecond}, false},
		{"negative interval", Config{Consumer: "c", ReclaimInterval: -time.Second}, false},
	} {
		before := tc.cfg
		err := tc.cfg.withDefaults().Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if tc.cfg != before {
			t.Errorf("%s: Validate changed the config", tc.name)
		}
	}
	for _, tc := range []struct {
		idle, want time.Duration
	}{
		{0, time.Second}, // default 15s idle → capped at 1s
		{300 * time.Millisecond, 100 * time.Millisecond},
		{90 * time.Millisecond, 50 * time.Millisecond},
	} {
		got := Config{Consumer: "c", ReclaimIdle: tc.idle}.withDefaults().ReclaimInterval
		if got != tc.want {
			t.Errorf("ReclaimInterval for ReclaimIdle %s = %s, want %s", tc.idle, got, tc.want)
		}
	}
	if StreamKey(DefaultPrefix) != "queue:streaming_requests_failover" || DeadLetterKey(DefaultPrefix) != "queue:dead_letter" {
		t.Errorf("keys = %q, %q; docs/QUEUE.md names queue:streaming_requests_failover and queue:dead_letter",
			StreamKey(DefaultPrefix), DeadLetterKey(DefaultPrefix))
	}
}

// TestNewDoesNoIO: constructing a Queue must not touch Redis, so processes
// start while Redis is still coming up.
func TestNewDoesNoIO(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	if _, err := New(Config{Consumer: "c"}, c); err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := New(Config{Consumer: "c"}, nil); err == nil {
		t.Fatal("New accepted a nil client")
	}
	if _, err := New(Config{}, c); err == nil {
		t.Fatal("New accepted a Config without Consumer")
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// fetchAll fetches until it holds n deliveries or fails after patience.
func fetchAll(t testing.TB, q *Queue, n int) []failover.Delivery {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	var got []failover.Delivery
	for len(got) < n {
		ds, err := q.Fetch(ctx, n-len(got))
		if err != nil {
			t.Fatalf("Fetch after %d of %d: %v", len(got), n, err)
		}
		got = append(got, ds...)
	}
	return got
}

func TestKeyLayout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	q, err := New(Config{Prefix: prefix, Consumer: "a"}, c) // default group
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	if err := q.Enqueue(ctx, "req-1", []byte("job")); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.XRange(ctx, StreamKey(prefix), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || len(msgs[0].Values) != 2 || msgs[0].Values["request_id"] != "req-1" || msgs[0].Values["body"] != "job" {
		t.Fatalf("stream entries = %+v, want one with exactly request_id=req-1 body=job", msgs)
	}
	fetchAll(t, q, 1)
	groups, err := c.XInfoGroups(ctx, StreamKey(prefix)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 1 || groups[0].Name != DefaultGroup || groups[0].Pending != 1 {
		t.Fatalf("groups = %+v, want %s with 1 pending", groups, DefaultGroup)
	}
}

func TestGroupCreationIdempotent(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	ctx := ctxT(t, 20*time.Second)
	// The group already exists, so both Queues meet BUSYGROUP.
	if err := c.XGroupCreateMkStream(ctx, StreamKey(prefix), DefaultGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	qa, qb := newQueue(t, c, prefix, "a"), newQueue(t, c, prefix, "b")
	for _, q := range []*Queue{qa, qb} {
		if err := q.Enqueue(ctx, "r", []byte("job")); err != nil {
			t.Fatal(err)
		}
	}
	da, db := fetchAll(t, qa, 1)[0], fetchAll(t, qb, 1)[0]
	if da.ID == db.ID {
		t.Fatalf("both members got entry %s", da.ID)
	}
	groups, err := c.XInfoGroups(ctx, StreamKey(prefix)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 1 || groups[0].Consumers != 2 || groups[0].Pending != 2 {
		t.Fatalf("groups = %+v, want one group with 2 consumers and 2 pending", groups)
	}
}

// TestJobSurvivesConsumerDeath is invariant 3 at the queue level.
func TestJobSurvivesConsumerDeath(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	ctx := ctxT(t, 20*time.Second)

	deadClient := redis.NewClient(&redis.Options{Addr: srv.Addr})
	a := newQueue(t, deadClient, prefix, "worker-a")
	if err := a.Enqueue(ctx, "req-1", []byte("survive me")); err != nil {
		t.Fatal(err)
	}
	first := fetchAll(t, a, 1)[0]
	fetchedAt := time.Now()
	_ = deadClient.Close() // the process is gone without Ack

	c := srv.Client(t)
	b := newQueue(t, c, prefix, "worker-b")
	got := fetchAll(t, b, 1)[0]
	if waited := time.Since(fetchedAt); waited < testIdle/2 {
		t.Fatalf("taken over after %s, before ReclaimIdle %s", waited, testIdle)
	}
	if got.ID != first.ID || got.Attempt != 2 || string(got.Body) != "survive me" {
		t.Fatalf("takeover = %+v, want entry %s attempt 2 body %q", got, first.ID, "survive me")
	}
	p, err := c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: StreamKey(prefix), Group: DefaultGroup, Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 1 || p[0].Consumer != "worker-b" || p[0].RetryCount != 2 {
		t.Fatalf("pending = %+v, want the entry held by worker-b, delivered twice", p)
	}
	if err := b.Ack(ctx, got); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Depth(ctx); err != nil || n != 0 {
		t.Fatalf("Depth = %d, %v; want 0", n, err)
	}
}

// TestNeverTrims is invariant 1: only acknowledged entries leave the
// stream, and depth is the real backlog.
func TestNeverTrims(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	ctx := ctxT(t, 30*time.Second)
	a, b := newQueue(t, c, prefix, "a"), newQueue(t, c, prefix, "b")
	const n = 1000
	for i := range n {
		if err := a.Enqueue(ctx, fmt.Sprint(i), fmt.Appendf(nil, "job-%04d", i)); err != nil {
			t.Fatal(err)
		}
	}
	unacked := map[string]string{} // id → body
	for i, d := range fetchAll(t, a, n) {
		if i%2 == 0 {
			if err := a.Ack(ctx, d); err != nil {
				t.Fatal(err)
			}
		} else {
			unacked[d.ID] = string(d.Body)
		}
	}
	if xlen := c.XLen(ctx, StreamKey(prefix)).Val(); xlen != n/2 {
		t.Fatalf("XLEN = %d, want %d", xlen, n/2)
	}
	if depth, err := a.Depth(ctx); err != nil || depth != n/2 {
		t.Fatalf("Depth = %d, %v; want %d", depth, err, n/2)
	}
	// a dies: b takes over every one of the 500, intact.
	for _, d := range fetchAll(t, b, n/2) {
		body, ok := unacked[d.ID]
		if !ok || body != string(d.Body) || d.Attempt != 2 {
			t.Fatalf("takeover %+v: unexpected (known=%v, want body %q attempt 2)", d, ok, body)
		}
		delete(unacked, d.ID)
		if err := b.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if len(unacked) != 0 {
		t.Fatalf("%d unacknowledged jobs lost", len(unacked))
	}
	if depth, _ := b.Depth(ctx); depth != 0 {
		t.Fatalf("Depth = %d after all acks, want 0", depth)
	}
}

func TestMissingBodyIsDeliveredAndDeadLettered(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	ctx := ctxT(t, 20*time.Second)
	q := newQueue(t, c, prefix, "a")
	for _, vals := range [][]any{{"request_id", "req-raw"}, {"junk", "x"}} {
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: StreamKey(prefix), Values: vals}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ds := fetchAll(t, q, 2)
	for _, d := range ds {
		if len(d.Body) != 0 || d.Attempt != 1 {
			t.Fatalf("delivery %+v, want empty body, attempt 1", d)
		}
		if err := q.DeadLetter(ctx, d, "undecodable job"); err != nil {
			t.Fatalf("DeadLetter: %v", err)
		}
	}
	dls, err := q.DeadLetters(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 || dls[0].RequestID != "req-raw" || dls[1].RequestID != "" ||
		dls[0].Reason != "undecodable job" || dls[0].Source != "job stream entry "+ds[0].ID || len(dls[0].Body) != 0 {
		t.Fatalf("dead letters = %+v", dls)
	}
	// Fetch keeps working after the malformed entries.
	if err := q.Enqueue(ctx, "req-ok", []byte("fine")); err != nil {
		t.Fatal(err)
	}
	if d := fetchAll(t, q, 1)[0]; string(d.Body) != "fine" {
		t.Fatalf("body = %q, want fine", d.Body)
	}
}

func TestDeadLetterRecordOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	ctx := ctxT(t, 20*time.Second)
	q := newQueue(t, c, prefix, "a")
	for _, id := range []string{"req-1", "req-2"} {
		if err := q.Enqueue(ctx, id, []byte(id+"-body")); err != nil {
			t.Fatal(err)
		}
	}
	ds := fetchAll(t, q, 2)
	before := time.Now()
	for range 2 { // a retry after a lost reply must not record twice
		if err := q.DeadLetter(ctx, ds[0], "gave up"); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Ack(ctx, ds[1]); err != nil {
		t.Fatal(err)
	}
	if err := q.DeadLetter(ctx, ds[1], "late"); err != nil { // acknowledged: nothing to record
		t.Fatal(err)
	}
	if n, err := q.DeadLetterDepth(ctx); err != nil || n != 1 {
		t.Fatalf("DeadLetterDepth = %d, %v; want 1", n, err)
	}
	dls, err := q.DeadLetters(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	d := dls[0]
	if d.RequestID != "req-1" || string(d.Body) != "req-1-body" || d.Reason != "gave up" || d.Attempt != 1 || d.Source != "job stream entry "+ds[0].ID {
		t.Fatalf("dead letter = %+v", d)
	}
	if d.FailedAt.Before(before.Add(-time.Second)) || d.FailedAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("FailedAt = %s, want about %s", d.FailedAt, before)
	}
	if n, _ := q.Depth(ctx); n != 0 {
		t.Fatalf("Depth = %d, want 0", n)
	}
}

// TestReclaimSkipsDeletedEntries: an entry deleted behind the group's back
// (XDEL without XACK) is dropped by XAUTOCLAIM, not delivered as a
// phantom job, and Fetch carries on.
func TestReclaimSkipsDeletedEntries(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	ctx := ctxT(t, 20*time.Second)
	a, b := newQueue(t, c, prefix, "a"), newQueue(t, c, prefix, "b")
	if err := a.Enqueue(ctx, "r", []byte("gone")); err != nil {
		t.Fatal(err)
	}
	d := fetchAll(t, a, 1)[0]
	if err := c.XDel(ctx, StreamKey(prefix), d.ID).Err(); err != nil {
		t.Fatal(err)
	}
	wait, cancel := context.WithTimeout(ctx, 4*testIdle)
	defer cancel()
	ds, err := b.Fetch(wait, 10)
	if len(ds) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch = %+v, %v; want nothing until the deadline", ds, err)
	}
	if n := c.XPending(ctx, StreamKey(prefix), DefaultGroup).Val().Count; n != 0 {
		t.Fatalf("%d entries still pending, want the deleted one dropped", n)
	}
}

// TestRedisDown: with Redis gone, calls fail fast with errors the api can
// turn into 503, instead of hanging.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	q := newQueue(t, c, redistest.Prefix(t), "a")
	srv.Stop()

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := q.Enqueue(ctx, "r", []byte("job"))
	if !errors.Is(err, failover.ErrQueueUnavailable) {
		t.Fatalf("Enqueue = %v, want ErrQueueUnavailable", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Enqueue took %s to fail", took)
	}
	if !strings.Contains(err.Error(), "redisstream: xadd ") {
		t.Errorf("error %q does not say what was being done", err)
	}

	ctx2, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	start = time.Now()
	if _, err := q.Depth(ctx2); err == nil {
		t.Fatal("Depth succeeded with Redis down")
	}
	if _, err := q.Fetch(ctx2, 1); err == nil {
		t.Fatal("Fetch succeeded with Redis down")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Depth and Fetch took %s to fail", took)
	}
}

// TestRecoversAfterRedisRestart: Redis comes back empty (no persistence),
// so the group is gone; the Queue recreates it on NOGROUP.
func TestRecoversAfterRedisRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := redistest.Prefix(t)
	q := newQueue(t, c, prefix, "a")
	ctx := ctxT(t, 30*time.Second)
	if err := q.Enqueue(ctx, "r0", []byte("before")); err != nil {
		t.Fatal(err)
	}
	held := fetchAll(t, q, 1)[0]

	srv.Restart(t)
	// The held job went down with Redis: Touch must say the claim is lost.
	if err := q.Touch(ctx, held); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("Touch after restart = %v, want ErrClaimLost", err)
	}

	// Producer first: the stream exists again, the group does not.
	if err := q.Enqueue(ctx, "r1", []byte("after restart")); err != nil {
		t.Fatal(err)
	}
	if d := fetchEventually(t, ctx, q); string(d.Body) != "after restart" || d.Attempt != 1 {
		t.Fatalf("delivery = %+v, want the new job", d)
	}

	srv.Restart(t)
	// Consumer first: neither stream nor group exist while it waits.
	got := make(chan failover.Delivery, 1)
	go func() { got <- fetchEventually(t, ctx, q) }()
	// Enqueue only once the waiting Fetch has recreated stream and group.
	testutil.Eventually(t, 30*time.Second, func() bool { return c.Exists(ctx, StreamKey(prefix)).Val() == 1 },
		"Fetch recreating the stream and group")
	if err := q.Enqueue(ctx, "r2", []byte("second restart")); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if string(d.Body) != "second restart" {
			t.Fatalf("body = %q, want %q", d.Body, "second restart")
		}
	case <-ctx.Done():
		t.Fatal("no delivery after the second restart")
	}
}

// fetchEventually retries Fetch across the errors a reconnect may surface,
// returning the first delivery; it reports failure by returning a zero
// Delivery after ctx ends (safe to call from another goroutine).
func fetchEventually(t testing.TB, ctx context.Context, q *Queue) failover.Delivery {
	var last error
	retry := time.NewTicker(20 * time.Millisecond)
	defer retry.Stop()
	for {
		ds, err := q.Fetch(ctx, 1)
		if err == nil {
			return ds[0]
		}
		last = err
		select {
		case <-ctx.Done():
			t.Errorf("Fetch never recovered: %v", last)
			return failover.Delivery{}
		case <-retry.C:
		}
	}
}

// TestReclaimTakesOnlyIdleJobsWithoutBlocking: Reclaim (the worker's
// takeover loop) answers at once, leaves new jobs and jobs whose claim is
// fresh alone, and takes every job idle for ReclaimIdle, as attempt 2,
// oldest first.
func TestReclaimTakesOnlyIdleJobsWithoutBlocking(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	ctx := ctxT(t, 20*time.Second)
	a := newQueue(t, srv.Client(t), prefix, "worker-a")
	b := newQueue(t, srv.Client(t), prefix, "worker-b")
	for i := range 4 {
		if err := a.Enqueue(ctx, fmt.Sprint("req-", i), []byte(fmt.Sprint("job ", i))); err != nil {
			t.Fatal(err)
		}
	}
	held := fetchAll(t, a, 3) // the fourth stays new
	start := time.Now()
	if ds, err := b.Reclaim(ctx, 10); err != nil || len(ds) != 0 {
		t.Fatalf("Reclaim before any claim went idle: %+v, %v; want none", ds, err)
	}
	if took := time.Since(start); took > testIdle/2 {
		t.Fatalf("Reclaim took %v with nothing to take; it must not block", took)
	}
	// worker-a keeps its claim on the last one fresh.
	var got []string
	deadline := time.Now().Add(3 * testIdle)
	for len(got) < 2 && time.Now().Before(deadline) {
		if err := a.Touch(ctx, held[2]); err != nil {
			t.Fatal(err)
		}
		ds, err := b.Reclaim(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Attempt != 2 {
				t.Errorf("takeover %+v, want attempt 2", d)
			}
			got = append(got, string(d.Body))
		}
		// Wait a reclaim round, as the worker's loop does.
		select {
		case <-time.After(b.ReclaimInterval()):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if !slices.Equal(got, []string{"job 0", "job 1"}) {
		t.Fatalf("taken over %q, want the two idle jobs, oldest first", got)
	}
	if waited := time.Since(start); waited < testIdle/2 {
		t.Fatalf("taken over after %v, before ReclaimIdle %v", waited, testIdle)
	}
	if ds := fetchAll(t, b, 1); string(ds[0].Body) != "job 3" || ds[0].Attempt != 1 {
		t.Fatalf("Fetch after the takeovers: %+v, want the new job 3", ds[0])
	}
}
