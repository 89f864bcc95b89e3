package redisstream

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// agedJob is a job of a backlog, put in its line as if enqueued age ago
// (an explicit entry id on the Redis clock), or now when age is 0.
type agedJob struct {
	name string
	prio protocol.Priority
	age  time.Duration
}

// agedBacklog is added oldest first within each line, as XADD requires.
// With the default aging of 30 s a job's place is its entry time, 30 s
// earlier for high and 30 s later for low:
//
//	L70 −40 s, H1 −31 s, H0 −30 s, L40 −10 s, N5 −5 s, N0 0, L20 +10 s
var (
	agedBacklog = []agedJob{
		{"L70", protocol.PriorityLow, 70 * time.Second},
		{"L40", protocol.PriorityLow, 40 * time.Second},
		{"L20", protocol.PriorityLow, 20 * time.Second},
		{"N5", protocol.PriorityNormal, 5 * time.Second},
		{"N0", protocol.PriorityNormal, 0},
		{"H1", protocol.PriorityHigh, time.Second},
		{"H0", protocol.PriorityHigh, 0},
	}
	agedOrder = []string{"L70", "H1", "H0", "L40", "N5", "N0", "L20"}
)

// addBacklog puts the jobs in q's lines: aged ones with explicit ids, the
// others through EnqueuePriority.
func addBacklog(t *testing.T, c redis.UniversalClient, q *Queue, jobs []agedJob) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.age == 0 {
			if err := q.EnqueuePriority(ctx, "req-"+j.name, j.prio, []byte(j.name)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		l := q.shardFor("req-" + j.name).lines[j.prio.Rank()]
		id := fmt.Sprintf("%d-0", now.Add(-j.age).UnixMilli())
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: l.stream, ID: id, Values: []any{"request_id", "req-" + j.name, "body", j.name}}).Err(); err != nil {
			t.Fatalf("xadd %s %s: %v", l.stream, id, err)
		}
	}
}

// fetchOrder fetches and acknowledges n jobs, `per` at most per Fetch,
// and returns their bodies in the order handed out.
func fetchOrder(t *testing.T, q *Queue, n, per int) []string {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	var got []string
	for len(got) < n {
		for _, d := range fetchAll(t, q, min(per, n-len(got))) {
			got = append(got, string(d.Body))
			if err := q.Ack(ctx, d); err != nil {
				t.Fatalf("ack %s: %v", d.ID, err)
			}
		}
	}
	return got
}

// A backlog of mixed priorities and ages, on real Redis (one Redis, a
// Cluster, and four shards): jobs start higher priority first, FIFO
// within a priority, a low job that waited two aging periods before a
// fresh high one, and Ack finds every line's entries.
func TestPriorityOrder(t *testing.T) {
	t.Parallel()
	for _, b := range backends(t) {
		for _, shards := range []int{1, 4} {
			for _, per := range []int{1, 3} {
				t.Run(fmt.Sprintf("%s/%d shards/%d per fetch", b.name, shards, per), func(t *testing.T) {
					c := b.client(t)
					q := newShardedQueue(t, c, redistest.Prefix(t), "a", shards)
					// The groups first: a group created after the entries
					// would start at 0 anyway; this is how consumers run.
					if err := q.ensureGroup(ctxT(t, 5*time.Second)); err != nil {
						t.Fatal(err)
					}
					addBacklog(t, c, q, agedBacklog)
					if d, err := q.Depth(ctxT(t, 5*time.Second)); err != nil || d != int64(len(agedBacklog)) {
						t.Fatalf("Depth = %d, %v; want %d", d, err, len(agedBacklog))
					}
					got := fetchOrder(t, q, len(agedBacklog), per)
					if strings.Join(got, " ") != strings.Join(agedOrder, " ") {
						t.Fatalf("start order %v, want %v", got, agedOrder)
					}
					if d, err := q.Depth(ctxT(t, 5*time.Second)); err != nil || d != 0 {
						t.Fatalf("Depth after every ack = %d, %v", d, err)
					}
				})
			}
		}
	}
}

// Aging counts: with an aging of 1 s, a low job enqueued 2.5 s ago goes
// before a normal job of 1 s ago and a high one of now (places −1.5 s,
// −1 s, −1 s); with the default 30 s it would go last.
func TestPriorityAgingSetting(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	jobs := []agedJob{
		{"low", protocol.PriorityLow, 2500 * time.Millisecond},
		{"normal", protocol.PriorityNormal, time.Second},
		{"high", protocol.PriorityHigh, 0},
	}
	for _, tt := range []struct {
		aging time.Duration
		want  string
	}{
		{time.Second, "low normal high"},
		{0, "high normal low"}, // the default
	} {
		q, err := New(Config{Prefix: redistest.Prefix(t) + tt.aging.String() + ":", Consumer: "a", PriorityAging: tt.aging}, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.ensureGroup(ctxT(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		addBacklog(t, c, q, jobs)
		if got := strings.Join(fetchOrder(t, q, 3, 1), " "); got != tt.want {
			t.Errorf("aging %s: order %s, want %s", tt.aging, got, tt.want)
		}
	}
}

// Delivery ids name their line, so Ack, Touch and DeadLetter reach it;
// a malformed one is refused.
func TestPriorityDeliveryIDs(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := ctxT(t, 20*time.Second)
	for _, shards := range []int{1, 3} {
		q := newShardedQueue(t, c, redistest.Prefix(t)+fmt.Sprint(shards)+":", "a", shards)
		for _, p := range protocol.Priorities {
			if err := q.EnqueuePriority(ctx, "req-"+string(p), p, []byte(p)); err != nil {
				t.Fatal(err)
			}
		}
		ds := fetchAll(t, q, 3)
		for _, d := range ds {
			if err := q.Touch(ctx, d); err != nil {
				t.Fatalf("%d shards: touch %s: %v", shards, d.ID, err)
			}
		}
		if err := q.DeadLetter(ctx, ds[0], "test"); err != nil {
			t.Fatalf("%d shards: dead-letter %s: %v", shards, ds[0].ID, err)
		}
		for _, d := range ds[1:] {
			if err := q.Ack(ctx, d); err != nil {
				t.Fatalf("%d shards: ack %s: %v", shards, d.ID, err)
			}
		}
		if n, _ := q.Depth(ctx); n != 0 {
			t.Errorf("%d shards: depth %d after settling all", shards, n)
		}
		if n, _ := q.DeadLetterDepth(ctx); n != 1 {
			t.Errorf("%d shards: %d dead letters, want 1", shards, n)
		}
		for _, bad := range []string{"x:1-0", "h:", "9:1-0", ""} {
			if err := q.Ack(ctx, failover.Delivery{ID: bad}); err == nil && (shards > 1 || bad != "9:1-0") {
				t.Errorf("%d shards: ack of %q accepted", shards, bad)
			}
		}
	}
}

// A blocking read that finds jobs already on two lines (they arrived after
// next.lua looked) hands over the better placed one and holds the other
// for the next Fetch, which returns it still claimed by this member.
func TestBlockingReadHoldsWhatExceedsLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := ctxT(t, 20*time.Second)
	q := newQueue(t, c, redistest.Prefix(t), "a")
	if err := q.ensureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.EnqueuePriority(ctx, "req-n", protocol.PriorityNormal, []byte("normal")); err != nil {
		t.Fatal(err)
	}
	if err := q.EnqueuePriority(ctx, "req-h", protocol.PriorityHigh, []byte("high")); err != nil {
		t.Fatal(err)
	}
	ds, err := q.block(ctx, q.shards[0], 1, 10*time.Millisecond)
	if err != nil || len(ds) != 1 || string(ds[0].Body) != "high" {
		t.Fatalf("block = %+v, %v; want the high job alone", ds, err)
	}
	// The held job comes first, even with another job waiting.
	if err := q.EnqueuePriority(ctx, "req-h2", protocol.PriorityHigh, []byte("high 2")); err != nil {
		t.Fatal(err)
	}
	got := fetchAll(t, q, 1)
	if string(got[0].Body) != "normal" || got[0].Attempt != 1 {
		t.Fatalf("next Fetch = %+v, want the held normal job", got[0])
	}
	for _, d := range append(ds, append(got, fetchAll(t, q, 1)...)...) {
		if err := q.Ack(ctx, d); err != nil {
			t.Fatalf("ack %s: %v", d.ID, err)
		}
	}
	if n, _ := q.Depth(ctx); n != 0 {
		t.Errorf("depth %d after acking all three", n)
	}
}

// An idle consumer blocked on the lines gets a job of any priority as it
// arrives, without waiting for Block to pass: on redis-server, and on
// miniredis for embedded mode.
func TestBlockingReadWakesOnAnyLine(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	m := miniredis.RunT(t)
	mc := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = mc.Close() })
	for name, c := range map[string]redis.UniversalClient{"redis": srv.Client(t), "miniredis": mc} {
		t.Run(name, func(t *testing.T) { testBlockingReadWakesOnAnyLine(t, c) })
	}
}

func testBlockingReadWakesOnAnyLine(t *testing.T, c redis.UniversalClient) {
	ctx := ctxT(t, 20*time.Second)
	q, err := New(Config{Prefix: redistest.Prefix(t), Consumer: "a", Block: 10 * time.Second}, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.ensureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range []protocol.Priority{protocol.PriorityLow, protocol.PriorityHigh, protocol.PriorityNormal} {
		got := make(chan []failover.Delivery, 1)
		go func() {
			ds, _ := q.Fetch(ctx, 5)
			got <- ds
		}()
		// Enqueued while the Fetch is (most likely) blocked; either way it
		// must come back with the job, well before Block.
		if err := q.EnqueuePriority(ctx, "req-"+string(p), p, []byte(p)); err != nil {
			t.Fatal(err)
		}
		select {
		case ds := <-got:
			if len(ds) != 1 || string(ds[0].Body) != string(p) {
				t.Fatalf("%s: Fetch = %+v", p, ds)
			}
			if err := q.Ack(ctx, ds[0]); err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: an idle Fetch did not take the new job within 5 s", p)
		}
	}
}
