// Package failovertest owns the behaviour suite every failover queue
// backend (redisstream, memqueue, kafka) must pass, like watermill's
// pubsub/tests. It talks to a backend only through the failover interfaces.
package failovertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
)

// Harness is one fresh, empty queue handed to a subtest. Every field but
// Kill is required.
type Harness struct {
	// Producer enqueues into the queue under test.
	Producer failover.Producer
	// Depth reports the backlog of the same queue.
	Depth failover.Depther
	// NewConsumer returns a consumer-group member called name; distinct
	// names stand for distinct worker processes.
	NewConsumer func(name string) failover.Consumer
	// ReclaimIdle is the backend's takeover time for an untouched job.
	// Keep it small (a few hundred milliseconds) so the suite is fast.
	ReclaimIdle time.Duration
	// DeadLetters returns every dead-lettered job, oldest first.
	DeadLetters func(ctx context.Context) ([]failover.DeadLetter, error)
	// Kill, if set, ends a consumer the way a crashed worker process ends:
	// it stops fetching and leaves the group without settling the jobs it
	// holds; its Touch must still report a claim lost once another member
	// took the job over. The suite calls it where a member stops working
	// on its job, for backends that hand a job over only once its holder
	// is gone from the group (Kafka moves a partition on a group
	// rebalance). Backends that take a job from a live member that merely
	// stopped touching it (Redis Streams, memqueue) leave it nil, and the
	// suite proves that stronger takeover.
	Kill func(failover.Consumer)
	// Unordered says the backend keeps enqueue order only within a shard
	// or partition (a Redis Streams queue split over several streams): the
	// suite then checks that each job arrives exactly once, not in order.
	Unordered bool
}

// kill ends c if the backend needs its members dead to take over.
func (h Harness) kill(c failover.Consumer) {
	if h.Kill != nil {
		h.Kill(c)
	}
}

// Run runs the behaviour suite. newHarness is called once per subtest with
// that subtest's t and must return a queue no other subtest uses; it
// registers its own cleanup with t.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"AckedJobLeavesBacklog", testAckedJobLeavesBacklog},
		{"DepthCountsUnacked", testDepthCountsUnacked},
		{"FetchReturnsAtMostMax", testFetchReturnsAtMostMax},
		{"UnackedJobRedelivered", testUnackedJobRedelivered},
		{"TouchKeepsClaim", testTouchKeepsClaim},
		{"StaleOwnerCannotSettle", testStaleOwnerCannotSettle},
		{"DeadLetter", testDeadLetter},
		{"ConcurrentExactlyOnce", testConcurrentExactlyOnce},
		{"FetchHonoursCancel", testFetchHonoursCancel},
		{"BinaryBodyRoundTrip", testBinaryBodyRoundTrip},
		{"FIFOForOneConsumer", testFIFOForOneConsumer},
		{"ReclaimOwnsTakeovers", testReclaimOwnsTakeovers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Producer == nil || h.Depth == nil || h.NewConsumer == nil || h.DeadLetters == nil || h.ReclaimIdle <= 0 {
				t.Fatalf("failovertest: incomplete Harness %+v", h)
			}
			tc.fn(t, h)
		})
	}
}

// patience bounds every wait for something that should happen.
func patience(h Harness) time.Duration { return 10*h.ReclaimIdle + 5*time.Second }

func ctxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func enqueue(t testing.TB, h Harness, requestID string, body []byte) {
	t.Helper()
	if err := h.Producer.Enqueue(ctxFor(t, 5*time.Second), requestID, body); err != nil {
		t.Fatalf("Enqueue(%q): %v", requestID, err)
	}
}

// fetchN fetches with the given max until it holds exactly n deliveries,
// failing on a batch larger than max or on running out of patience.
func fetchN(t testing.TB, h Harness, c failover.Consumer, n, max int) []failover.Delivery {
	t.Helper()
	ctx := ctxFor(t, patience(h))
	var got []failover.Delivery
	for len(got) < n {
		ds, err := c.Fetch(ctx, max)
		if err != nil {
			t.Fatalf("Fetch after %d of %d deliveries: %v", len(got), n, err)
		}
		if len(ds) == 0 || len(ds) > max {
			t.Fatalf("Fetch(max=%d) returned %d deliveries and no error", max, len(ds))
		}
		got = append(got, ds...)
	}
	if len(got) != n {
		t.Fatalf("got %d deliveries, want %d", len(got), n)
	}
	return got
}

// expectNothing asserts that c.Fetch yields nothing for d and ends with
// the context's deadline.
func expectNothing(t testing.TB, c failover.Consumer, d time.Duration, why string) {
	t.Helper()
	ds, err := c.Fetch(ctxFor(t, d), 10)
	if len(ds) > 0 {
		t.Fatalf("%s: Fetch returned %d deliveries (first: attempt %d body %q)", why, len(ds), ds[0].Attempt, ds[0].Body)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: Fetch error = %v, want context.DeadlineExceeded", why, err)
	}
}

func wantDepth(t testing.TB, h Harness, want int64) {
	t.Helper()
	got, err := h.Depth.Depth(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Depth: %v", err)
	}
	if got != want {
		t.Fatalf("Depth = %d, want %d", got, want)
	}
}

func ack(t testing.TB, c failover.Consumer, d failover.Delivery) {
	t.Helper()
	if err := c.Ack(ctxFor(t, 5*time.Second), d); err != nil {
		t.Fatalf("Ack(%s): %v", d.ID, err)
	}
}

func testAckedJobLeavesBacklog(t *testing.T, h Harness) {
	c := h.NewConsumer("a")
	enqueue(t, h, "req-1", []byte("job-1"))
	wantDepth(t, h, 1)
	d := fetchN(t, h, c, 1, 1)[0]
	if string(d.Body) != "job-1" || d.Attempt != 1 || d.ID == "" {
		t.Fatalf("delivery = %+v, want body job-1, attempt 1, an id", d)
	}
	ack(t, c, d)
	wantDepth(t, h, 0)
	// An acknowledged job is never handed out again, not even after it
	// would have gone idle.
	expectNothing(t, h.NewConsumer("b"), 3*h.ReclaimIdle, "after Ack")
}

func testDepthCountsUnacked(t *testing.T, h Harness) {
	c := h.NewConsumer("a")
	for i := range 5 {
		enqueue(t, h, fmt.Sprintf("req-%d", i), fmt.Appendf(nil, "job-%d", i))
	}
	wantDepth(t, h, 5)
	ds := fetchN(t, h, c, 2, 1)
	wantDepth(t, h, 5) // delivered but unacknowledged jobs are still backlog
	ack(t, c, ds[0])
	wantDepth(t, h, 4)
	if err := c.DeadLetter(ctxFor(t, 5*time.Second), ds[1], "test"); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	wantDepth(t, h, 3)
	for _, d := range fetchN(t, h, c, 3, 3) {
		ack(t, c, d)
	}
	wantDepth(t, h, 0)
}

func testFetchReturnsAtMostMax(t *testing.T, h Harness) {
	c := h.NewConsumer("a")
	const n = 10
	for i := range n {
		enqueue(t, h, fmt.Sprintf("req-%d", i), fmt.Appendf(nil, "job-%d", i))
	}
	// fetchN fails on any batch larger than max.
	ds := fetchN(t, h, c, n, 3)
	seen := map[string]bool{}
	for _, d := range ds {
		if seen[string(d.Body)] {
			t.Fatalf("job %q delivered twice", d.Body)
		}
		seen[string(d.Body)] = true
		ack(t, c, d)
	}
	wantDepth(t, h, 0)
}

func testUnackedJobRedelivered(t *testing.T, h Harness) {
	a, b := h.NewConsumer("a"), h.NewConsumer("b")
	enqueue(t, h, "req-1", []byte("survivor"))
	first := fetchN(t, h, a, 1, 1)[0]
	fetchedAt := time.Now()
	h.kill(a)
	// a never acknowledges nor touches: it is dead. b takes the job over,
	// but only once it has been idle for ReclaimIdle.
	second := fetchN(t, h, b, 1, 1)[0]
	if waited := time.Since(fetchedAt); waited < h.ReclaimIdle/2 {
		t.Fatalf("job taken over after %s, before ReclaimIdle %s", waited, h.ReclaimIdle)
	}
	if second.Attempt != 2 || !bytes.Equal(second.Body, first.Body) {
		t.Fatalf("takeover delivery = attempt %d body %q, want attempt 2 body %q", second.Attempt, second.Body, first.Body)
	}
	// b dies too: the count keeps growing with each takeover.
	h.kill(b)
	c := h.NewConsumer("c")
	third := fetchN(t, h, c, 1, 1)[0]
	if third.Attempt != 3 || !bytes.Equal(third.Body, first.Body) {
		t.Fatalf("second takeover = attempt %d body %q, want attempt 3 body %q", third.Attempt, third.Body, first.Body)
	}
	wantDepth(t, h, 1)
	ack(t, c, third)
	wantDepth(t, h, 0)
}

func testTouchKeepsClaim(t *testing.T, h Harness) {
	a, b := h.NewConsumer("a"), h.NewConsumer("b")
	enqueue(t, h, "req-1", []byte("long job"))
	d := fetchN(t, h, a, 1, 1)[0]

	// a is alive: it touches its job every ReclaimIdle/3.
	touchCtx, stopTouching := context.WithCancel(t.Context())
	touchErr := make(chan error, 1)
	lastTouch := make(chan time.Time, 1)
	go func() {
		tick := time.NewTicker(h.ReclaimIdle / 3)
		defer tick.Stop()
		last := time.Now()
		defer func() { lastTouch <- last }()
		for {
			select {
			case <-touchCtx.Done():
				touchErr <- nil
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(touchCtx, 5*time.Second)
				err := a.Touch(ctx, d)
				cancel()
				if err != nil {
					if touchCtx.Err() != nil {
						continue // stopped mid-Touch; the select returns next
					}
					touchErr <- err
					return
				}
				last = time.Now()
			}
		}
	}()
	expectNothing(t, b, 3*h.ReclaimIdle, "while the owner touches its job")
	stopTouching()
	if err := <-touchErr; err != nil {
		t.Fatalf("Touch by the owner: %v", err)
	}
	stoppedAt := <-lastTouch
	h.kill(a)

	// Once a stops touching, b takes over; Touch did not count attempts.
	taken := fetchN(t, h, b, 1, 1)[0]
	if waited := time.Since(stoppedAt); waited < h.ReclaimIdle/2 {
		t.Fatalf("job taken over %s after the last Touch, before ReclaimIdle %s", waited, h.ReclaimIdle)
	}
	if taken.Attempt != 2 || !bytes.Equal(taken.Body, d.Body) {
		t.Fatalf("takeover delivery = attempt %d body %q, want attempt 2 body %q", taken.Attempt, taken.Body, d.Body)
	}
	// a's claim is gone: its Touch must say so rather than take the job
	// back from b.
	if err := a.Touch(ctxFor(t, 5*time.Second), d); err == nil {
		t.Fatal("Touch by the former owner after takeover succeeded, want an error")
	}
	if err := b.Touch(ctxFor(t, 5*time.Second), taken); err != nil {
		t.Fatalf("Touch by the new owner: %v", err)
	}
	ack(t, b, taken)
	wantDepth(t, h, 0)
}

// testStaleOwnerCannotSettle: a member that stalled past ReclaimIdle and
// lost its job to another cannot acknowledge or dead-letter it any more
// (failover.ErrClaimLost): the successor's claim stays, no dead letter is
// written, and the successor settles the job.
func testStaleOwnerCannotSettle(t *testing.T, h Harness) {
	a, b := h.NewConsumer("a"), h.NewConsumer("b")
	enqueue(t, h, "req-1", []byte("contested"))
	stale := fetchN(t, h, a, 1, 1)[0]
	h.kill(a)
	taken := fetchN(t, h, b, 1, 1)[0]
	if taken.Attempt != 2 {
		t.Fatalf("takeover attempt %d, want 2", taken.Attempt)
	}
	if err := a.DeadLetter(ctxFor(t, 5*time.Second), stale, "stale owner gives up"); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("DeadLetter by the stale owner = %v, want ErrClaimLost", err)
	}
	if err := a.Ack(ctxFor(t, 5*time.Second), stale); !errors.Is(err, failover.ErrClaimLost) {
		t.Fatalf("Ack by the stale owner = %v, want ErrClaimLost", err)
	}
	if err := b.Touch(ctxFor(t, 5*time.Second), taken); err != nil {
		t.Fatalf("Touch by the successor after the stale owner's settle: %v", err)
	}
	dls, err := h.DeadLetters(ctxFor(t, 5*time.Second))
	if err != nil || len(dls) != 0 {
		t.Fatalf("dead letters %+v, %v; want none", dls, err)
	}
	wantDepth(t, h, 1)
	ack(t, b, taken)
	wantDepth(t, h, 0)
}

func testDeadLetter(t *testing.T, h Harness) {
	a, b := h.NewConsumer("a"), h.NewConsumer("b")
	enqueue(t, h, "req-ok", []byte("fine"))
	enqueue(t, h, "req-dl", []byte("poison"))
	// a finishes the good job and dies holding the poison job.
	ds := fetchN(t, h, a, 2, 2)
	if string(ds[0].Body) != "fine" {
		ds[0], ds[1] = ds[1], ds[0]
	}
	if string(ds[0].Body) != "fine" || string(ds[1].Body) != "poison" {
		t.Fatalf("deliveries %q and %q, want fine and poison", ds[0].Body, ds[1].Body)
	}
	ack(t, a, ds[0])
	h.kill(a)
	d := fetchN(t, h, b, 1, 1)[0]
	if d.Attempt != 2 || string(d.Body) != "poison" {
		t.Fatalf("takeover delivery = attempt %d body %q, want attempt 2 body poison", d.Attempt, d.Body)
	}
	if err := b.DeadLetter(ctxFor(t, 5*time.Second), d, "provider kept failing"); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	wantDepth(t, h, 0)
	recs, err := h.DeadLetters(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatalf("DeadLetters: %v", err)
	}
	want := failover.DeadLetter{RequestID: "req-dl", Body: []byte("poison"), Reason: "provider kept failing", Attempt: 2}
	if len(recs) != 1 || recs[0].RequestID != want.RequestID || !bytes.Equal(recs[0].Body, want.Body) ||
		recs[0].Reason != want.Reason || recs[0].Attempt != want.Attempt {
		t.Fatalf("dead letters = %+v, want exactly [%+v]", recs, want)
	}
	expectNothing(t, h.NewConsumer("c"), 3*h.ReclaimIdle, "after DeadLetter")
}

func testConcurrentExactlyOnce(t *testing.T, h Harness) {
	const (
		jobs      = 500
		consumers = 2
		perMember = 4 // goroutines fetching per consumer, like a worker's loop
	)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second+patience(h))
	defer cancel()

	var (
		mu    sync.Mutex
		seen  = make(map[string]int, jobs)
		acked int
		fails []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		fails = append(fails, fmt.Sprintf(format, args...))
		mu.Unlock()
		cancel()
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		// Not ctx: a consumer may see and acknowledge the last job, ending
		// ctx, before the backend's acknowledgement reaches Enqueue.
		enqueueCtx, cancelEnqueue := context.WithTimeout(t.Context(), 30*time.Second+patience(h))
		defer cancelEnqueue()
		for i := range jobs {
			if err := h.Producer.Enqueue(enqueueCtx, fmt.Sprintf("req-%d", i), fmt.Appendf(nil, "job-%03d", i)); err != nil {
				fail("Enqueue %d: %v", i, err)
				return
			}
		}
	})
	for m := range consumers {
		c := h.NewConsumer(fmt.Sprintf("member-%d", m))
		for range perMember {
			wg.Go(func() {
				for {
					ds, err := c.Fetch(ctx, 10)
					if ctx.Err() != nil {
						return
					}
					if err != nil {
						fail("Fetch: %v", err)
						return
					}
					if len(ds) == 0 || len(ds) > 10 {
						fail("Fetch(max=10) returned %d deliveries", len(ds))
						return
					}
					// Each delivery is settled on its own goroutine, as a
					// worker's jobs are: ten acknowledgements one after
					// another could outlast ReclaimIdle on a loaded machine
					// (a backend may make each wait for the call before it)
					// and see the last deliveries taken over.
					var acks sync.WaitGroup
					for _, d := range ds {
						if d.Attempt != 1 {
							fail("job %q redelivered (attempt %d) although no member died", d.Body, d.Attempt)
						}
						mu.Lock()
						seen[string(d.Body)]++
						mu.Unlock()
						acks.Go(func() {
							if err := c.Ack(ctx, d); err != nil {
								fail("Ack: %v", err)
								return
							}
							mu.Lock()
							acked++
							if acked == jobs {
								cancel()
							}
							mu.Unlock()
						})
					}
					acks.Wait()
				}
			})
		}
	}
	wg.Wait()
	if len(fails) > 0 {
		t.Fatalf("%d failures, first: %s", len(fails), fails[0])
	}
	for i := range jobs {
		if n := seen[fmt.Sprintf("job-%03d", i)]; n != 1 {
			t.Errorf("job-%03d delivered %d times, want once", i, n)
		}
	}
	if len(seen) != jobs || acked != jobs {
		t.Fatalf("saw %d distinct jobs and %d acks, want %d of each", len(seen), acked, jobs)
	}
	wantDepth(t, h, 0)
}

func testFetchHonoursCancel(t *testing.T, h Harness) {
	c := h.NewConsumer("a")
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(t.Context())
			stop := time.AfterFunc(100*time.Millisecond, cancel)
			return ctx, func() { stop.Stop(); cancel() }
		}, context.Canceled},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(t.Context(), 100*time.Millisecond)
		}, context.DeadlineExceeded},
		{"already cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			return ctx, cancel
		}, context.Canceled},
	} {
		ctx, cancel := tc.ctx()
		start := time.Now()
		ds, err := c.Fetch(ctx, 5)
		took := time.Since(start)
		cancel()
		if len(ds) != 0 || !errors.Is(err, tc.want) {
			t.Errorf("%s: Fetch on an empty queue = %d deliveries, %v; want none, %v", tc.name, len(ds), err, tc.want)
		}
		if took > 2*time.Second+100*time.Millisecond {
			t.Errorf("%s: Fetch took %s to notice its context ended, want < 2s", tc.name, took)
		}
	}
	// The consumer still works after cancelled fetches.
	enqueue(t, h, "req-1", []byte("after cancel"))
	d := fetchN(t, h, c, 1, 1)[0]
	if string(d.Body) != "after cancel" {
		t.Fatalf("body = %q, want %q", d.Body, "after cancel")
	}
	ack(t, c, d)
}

func testBinaryBodyRoundTrip(t *testing.T, h Harness) {
	allBytes := make([]byte, 512)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	random := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.UintN(256))
	}
	bodies := [][]byte{
		allBytes,
		random,
		[]byte("\x00"),
		[]byte("data: x\r\n\r\nevent: done\n"),
		{0xff, 0xfe, 0xc3, 0x28}, // not UTF-8
		[]byte(`{"request_id":"r","messages":[{"role":"user","content":"héllo ✓"}]}`),
	}
	for i, b := range bodies {
		enqueue(t, h, fmt.Sprintf("req-%d", i), b)
	}
	c := h.NewConsumer("a")
	ds := fetchN(t, h, c, len(bodies), len(bodies))
	if h.Unordered {
		ds = inEnqueueOrder(t, ds, bodies)
	}
	for i, d := range ds {
		if !bytes.Equal(d.Body, bodies[i]) {
			t.Errorf("body %d: got %d bytes %.32q…, want %d bytes %.32q…", i, len(d.Body), d.Body, len(bodies[i]), bodies[i])
		}
		ack(t, c, d)
	}
	wantDepth(t, h, 0)
}

func testFIFOForOneConsumer(t *testing.T, h Harness) {
	const n = 20
	for i := range n {
		enqueue(t, h, fmt.Sprintf("req-%d", i), fmt.Appendf(nil, "job-%02d", i))
	}
	c := h.NewConsumer("a")
	ds := fetchN(t, h, c, n, 3)
	if h.Unordered {
		bodies := make([][]byte, n)
		for i := range n {
			bodies[i] = fmt.Appendf(nil, "job-%02d", i)
		}
		ds = inEnqueueOrder(t, ds, bodies)
	}
	for i, d := range ds {
		if want := fmt.Sprintf("job-%02d", i); string(d.Body) != want {
			t.Fatalf("delivery %d = %q, want %q (FIFO)", i, d.Body, want)
		}
		ack(t, c, d)
	}
	wantDepth(t, h, 0)
}

// inEnqueueOrder returns ds reordered to match bodies, one delivery per
// body, failing on a delivery that matches no body left.
func inEnqueueOrder(t testing.TB, ds []failover.Delivery, bodies [][]byte) []failover.Delivery {
	t.Helper()
	out := make([]failover.Delivery, len(bodies))
	used := make([]bool, len(bodies))
	for _, d := range ds {
		i := slices.IndexFunc(bodies, func(b []byte) bool { return bytes.Equal(b, d.Body) })
		for i >= 0 && used[i] {
			j := slices.IndexFunc(bodies[i+1:], func(b []byte) bool { return bytes.Equal(b, d.Body) })
			if j < 0 {
				i = -1
			} else {
				i += 1 + j
			}
		}
		if i < 0 {
			t.Fatalf("delivery with body %.32q… matches no job enqueued, or one already delivered", d.Body)
		}
		used[i] = true
		out[i] = d
	}
	return out
}

// testReclaimOwnsTakeovers: for a backend with failover.Reclaimer, once a
// member has called Reclaim its Fetch takes no idle job over (the
// worker's takeover loop owns takeovers: their order and their log line);
// Reclaim takes the orphan. Backends without it skip.
func testReclaimOwnsTakeovers(t *testing.T, h Harness) {
	a, b := h.NewConsumer("a"), h.NewConsumer("b")
	r, ok := b.(failover.Reclaimer)
	if !ok {
		t.Skip("no failover.Reclaimer")
	}
	enqueue(t, h, "req-1", []byte("orphan"))
	first := fetchN(t, h, a, 1, 1)[0]
	h.kill(a)
	ctx := ctxFor(t, patience(h))
	if ds, err := r.Reclaim(ctx, 10); err != nil || len(ds) != 0 {
		t.Fatalf("Reclaim before the job went idle = %d deliveries, %v; want none", len(ds), err)
	}
	expectNothing(t, b, 3*h.ReclaimIdle, "Fetch after Reclaim, with an orphan idle")
	var got []failover.Delivery
	for len(got) == 0 {
		ds, err := r.Reclaim(ctx, 10)
		if err != nil {
			t.Fatalf("Reclaim: %v", err)
		}
		got = ds
		if len(got) == 0 {
			select {
			case <-ctx.Done():
				t.Fatal("Reclaim never took the orphan over")
			case <-time.After(r.ReclaimInterval()):
			}
		}
	}
	if len(got) != 1 || got[0].Attempt != 2 || !bytes.Equal(got[0].Body, first.Body) {
		t.Fatalf("Reclaim = %d deliveries (first attempt %d), want the orphan at attempt 2", len(got), got[0].Attempt)
	}
	ack(t, b, got[0])
	wantDepth(t, h, 0)
}
