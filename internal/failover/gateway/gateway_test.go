package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/memqueue"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/memresults"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Every test runs inside a testing/synctest bubble on plain in-memory
// fakes: memqueue for the queue, memresults.Memory for the result channel and
// cancellations, counters for metrics. Durations are exact on the
// bubble's clock.

// Gateway durations: silence after a worker spoke is 3·1s + 5s + 3·1s.
const (
	gwQueueTimeout = 2 * time.Second
	gwHeartbeat    = time.Second
	gwReclaimIdle  = 5 * time.Second
	gwSilence      = 6*gwHeartbeat + gwReclaimIdle
)

func gatewayConfig() gateway.Config {
	return gateway.Config{
		QueueTimeout:    gwQueueTimeout,
		WorkerHeartbeat: gwHeartbeat,
		ReclaimIdle:     gwReclaimIdle,
		// Not whole seconds: the advice rounds up to 3 (truncating gave 2).
		RetryAfter: 2500 * time.Millisecond,
	}
}

// counters is a gateway.Metrics that counts by method and label.
type counters struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counters) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
}

func (c *counters) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

func (c *counters) QueueRejected(reason string, _ protocol.Priority) { c.add("rejected:" + reason) }
func (c *counters) MalformedMessage(source string)                   { c.add("malformed:" + source) }
func (c *counters) SubscriptionLost(reason string)                   { c.add("lost:" + reason) }
func (c *counters) ResultDropped(reason string)                      { c.add("dropped:" + reason) }
func (c *counters) StreamGap(outcome string)                         { c.add("gap:" + outcome) }

// env is one test's queue, result channel and metrics.
type env struct {
	tb  testing.TB
	q   *memqueue.Queue
	res *memresults.Memory
	m   *counters
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	q, err := memqueue.New(memqueue.Config{ReclaimIdle: 15 * time.Second})
	if err != nil {
		tb.Fatalf("memqueue.New: %v", err)
	}
	res, err := memresults.New(memresults.Config{})
	if err != nil {
		tb.Fatalf("results.NewMemory: %v", err)
	}
	return &env{tb: tb, q: q, res: res, m: &counters{}}
}

func (e *env) gateway(p failover.Producer) *gateway.Gateway {
	e.tb.Helper()
	g, err := gateway.New(gatewayConfig(), gateway.Deps{
		Producer: p, Results: e.res, Canceller: e.res, Metrics: e.m, Log: testutil.DiscardLogger(),
	})
	if err != nil {
		e.tb.Fatalf("gateway.New: %v", err)
	}
	return g
}

func newJob(id string) protocol.Job {
	return protocol.Job{RequestID: id, UserID: "user-1",
		Payload: protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "tell me about " + id}}}}
}

func spill(tb testing.TB, g *gateway.Gateway, id string) failover.Relay {
	tb.Helper()
	r, err := g.Spill(context.Background(), newJob(id))
	if err != nil {
		tb.Fatalf("Spill: %v", err)
	}
	tb.Cleanup(func() { r.Close(true) })
	return r
}

func (e *env) publish(id, msg string) {
	e.tb.Helper()
	listened, err := e.res.PublishResult(context.Background(), id, []byte(msg))
	if err != nil || !listened {
		e.tb.Fatalf("publish %q: listened %v, %v; want the relay's subscription", msg, listened, err)
	}
}

func (e *env) depth() int64 {
	e.tb.Helper()
	n, err := e.q.Depth(context.Background())
	if err != nil {
		e.tb.Fatalf("Depth: %v", err)
	}
	return n
}

// nextResult returns the relay's next result, failing the test when none
// comes within d or the relay gave up.
func nextResult(tb testing.TB, r failover.Relay, d time.Duration) protocol.Result {
	tb.Helper()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case res := <-r.Results():
		return res
	case <-r.Done():
		tb.Fatalf("relay gave up: %+v", r.Problem())
	case <-t.C:
		tb.Fatalf("no result within %v", d)
	}
	return protocol.Result{}
}

func isDone(r failover.Relay) bool {
	select {
	case <-r.Done():
		return true
	default:
		return false
	}
}

// producerFunc is a Producer made of a function, counting its calls.
type producerFunc struct {
	calls   atomic.Int32
	enqueue func(ctx context.Context, requestID string, body []byte) error
}

func (p *producerFunc) Enqueue(ctx context.Context, requestID string, body []byte) error {
	p.calls.Add(1)
	return p.enqueue(ctx, requestID, body)
}

func TestGatewaySubscribesBeforeEnqueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		// A worker so fast that it answers while Enqueue is still running.
		var heard atomic.Bool
		p := &producerFunc{enqueue: func(ctx context.Context, id string, body []byte) error {
			if _, err := protocol.DecodeJob(body); err != nil {
				return fmt.Errorf("enqueued a job that does not decode: %w", err)
			}
			listened, err := e.res.PublishResult(ctx, id, []byte(`SIGNAL:DONE:{"request_id":"`+id+`"}`))
			heard.Store(listened)
			return err
		}}
		g := e.gateway(p)
		r := spill(t, g, "early-1")
		if n := p.calls.Load(); n != 1 {
			t.Fatalf("Spill enqueued %d times, want once", n)
		}
		if !heard.Load() {
			t.Fatal("the DONE published from inside Enqueue reached no subscriber: Spill enqueued before subscribing")
		}
		res := nextResult(t, r, 5*time.Second)
		if res.Kind != protocol.KindDone || res.Done == nil || res.Done.RequestID != "early-1" {
			t.Fatalf("result %+v, want the DONE published during Enqueue", res)
		}
	})
}

func TestGatewayQueueTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		g := e.gateway(e.q) // no worker takes the job
		start := time.Now()
		r := spill(t, g, "wait-1")
		if d := e.depth(); d != 1 {
			t.Fatalf("queue depth %d after Spill, want 1", d)
		}
		testutil.AdvanceFakeClock(gwQueueTimeout - time.Millisecond - time.Since(start))
		if isDone(r) {
			t.Fatalf("relay gave up %v after Spill, before the queue timeout of %v", time.Since(start), gwQueueTimeout)
		}
		select {
		case <-r.Done():
		case <-time.After(time.Second):
			t.Fatal("relay did not give up after the queue timeout")
		}
		if took := time.Since(start); took != gwQueueTimeout {
			t.Errorf("relay gave up after %v, want %v", took, gwQueueTimeout)
		}
		p := r.Problem()
		if p == nil || p.Slug() != protocol.ProblemQueueTimeout || p.Status != http.StatusServiceUnavailable || p.RetryAfterSeconds != 3 {
			t.Fatalf("problem %+v, want queue-timeout, 503, retry_after 3 (2.5 s rounded up)", p)
		}
		if n := e.m.get("rejected:timeout"); n != 1 {
			t.Errorf("QueueRejections{reason=timeout} = %v, want 1", n)
		}
	})
}

func TestGatewayWorkerLost(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		g := e.gateway(e.q)
		start := time.Now()
		r := spill(t, g, "lost-1")

		testutil.AdvanceFakeClock(gwQueueTimeout / 2)
		e.publish("lost-1", "SIGNAL:HEARTBEAT")
		if res := nextResult(t, r, time.Second); res.Kind != protocol.KindHeartbeat {
			t.Fatalf("result %+v, want the heartbeat", res)
		}
		// Past the queue timeout, the worker's heartbeat keeps the relay.
		testutil.AdvanceFakeClock(gwSilence - 2*time.Second)
		if isDone(r) {
			t.Fatalf("relay gave up %v after Spill with a worker that spoke %v ago: %+v",
				time.Since(start), gwSilence-2*time.Second, r.Problem())
		}
		e.publish("lost-1", "SIGNAL:HEARTBEAT")
		nextResult(t, r, time.Second)
		spoke := time.Now()

		testutil.AdvanceFakeClock(gwSilence - time.Millisecond)
		if isDone(r) {
			t.Fatalf("relay gave up after %v of silence, before %v", time.Since(spoke), gwSilence)
		}
		select {
		case <-r.Done():
		case <-time.After(time.Second):
			t.Fatal("relay did not give up on a silent worker")
		}
		if silent := time.Since(spoke); silent != gwSilence {
			t.Errorf("relay gave up after %v of silence, want %v (6 heartbeats + ReclaimIdle)", silent, gwSilence)
		}
		p := r.Problem()
		if p == nil || p.Slug() != protocol.ProblemWorkerLost || p.Status != http.StatusServiceUnavailable || p.RetryAfterSeconds < 1 {
			t.Fatalf("problem %+v, want worker-lost, 503, retry_after ≥ 1", p)
		}
		if n := e.m.get("rejected:timeout"); n != 0 {
			t.Errorf("QueueRejections{reason=timeout} = %v for a job a worker started", n)
		}
	})
}

func TestGatewayClose(t *testing.T) {
	t.Parallel()
	for _, completed := range []bool{false, true} {
		t.Run(fmt.Sprintf("completed=%v", completed), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				cancels, err := e.res.WatchCancels(context.Background())
				if err != nil {
					t.Fatalf("WatchCancels: %v", err)
				}
				defer cancels.Close()
				g := e.gateway(e.q)
				r := spill(t, g, "close-1")
				r.Close(completed)
				r.Close(completed) // idempotent
				synctest.Wait()

				ttl, marked := e.res.CancelMark("close-1")
				var notices []string
				for len(cancels.C()) > 0 {
					notices = append(notices, <-cancels.C())
				}
				if completed {
					if marked || len(notices) > 0 {
						t.Errorf("Close(true) cancelled the request: mark %v, notices %q", marked, notices)
					}
				} else {
					if len(notices) != 1 || notices[0] != "close-1" {
						t.Errorf("cancel notices %q, want the request id once", notices)
					}
					if want := gwQueueTimeout + gwReclaimIdle + 6*gwHeartbeat; !marked || ttl != want {
						t.Errorf("cancel mark %v with TTL %v, want one with %v", marked, ttl, want)
					}
				}
				if e.res.Subscribed("close-1") {
					t.Error("subscription still open after Close")
				}
			})
		})
	}
}

func TestGatewaySkipsMalformedMessages(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		g := e.gateway(e.q)
		start := time.Now()
		r := spill(t, g, "junk-1")
		for _, msg := range []string{"hello", `BATCH:[{"seq":0,"content":"x"}]`, "SIGNAL:ERROR:{}"} {
			e.publish("junk-1", msg)
		}
		synctest.Wait()
		if n := e.m.get("malformed:result_channel"); n != 3 {
			t.Errorf("MalformedMessages{source=result_channel} = %v, want 3", n)
		}
		select {
		case res := <-r.Results():
			t.Fatalf("malformed message relayed as %+v", res)
		default:
		}
		// Junk is not a worker speaking: the queue timeout still applies.
		<-r.Done()
		if p := r.Problem(); p.Slug() != protocol.ProblemQueueTimeout || time.Since(start) != gwQueueTimeout {
			t.Errorf("relay gave up with %+v after %v, want queue-timeout after %v", p, time.Since(start), gwQueueTimeout)
		}

		// Junk between good messages is skipped, the rest relayed in order.
		r2 := spill(t, g, "junk-2")
		for _, msg := range []string{"SIGNAL:HEARTBEAT", "BATCH:[", `BATCH:[{"seq":1,"content":"Hi"}]`, "\x00", "SIGNAL:DONE"} {
			e.publish("junk-2", msg)
		}
		for _, want := range []protocol.ResultKind{protocol.KindHeartbeat, protocol.KindBatch, protocol.KindDone} {
			if res := nextResult(t, r2, time.Second); res.Kind != want {
				t.Fatalf("result %+v, want %v", res, want)
			}
		}
		if n := e.m.get("malformed:result_channel"); n != 5 {
			t.Errorf("MalformedMessages{source=result_channel} = %v, want 5", n)
		}
	})
}

func TestGatewaySubscriptionLost(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		cause  error
		slug   string
		reason string
	}{
		{"connection lost", errors.New("fake: connection reset"), protocol.ProblemQueueUnavailable, "connection_lost"},
		{"overflow", fmt.Errorf("fake: %w", failover.ErrResultOverflow), protocol.ProblemSlowClient, "overflow"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t)
				g := e.gateway(e.q)
				const n = 20
				relays := make([]failover.Relay, n)
				for i := range relays {
					relays[i] = spill(t, g, fmt.Sprintf("gone-%d", i))
				}
				for i := range relays {
					e.res.Drop(fmt.Sprintf("gone-%d", i), tt.cause)
				}
				for i, r := range relays {
					select {
					case <-r.Done():
					case <-time.After(time.Second):
						t.Fatalf("relay %d did not give up when its subscription ended", i)
					}
					if p := r.Problem(); p == nil || p.Slug() != tt.slug || p.Status != http.StatusServiceUnavailable || p.RetryAfterSeconds < 1 {
						t.Errorf("relay %d gave up with %+v, want %s with retry_after", i, p, tt.slug)
					}
				}
				if got := e.m.get("lost:" + tt.reason); got != n {
					t.Errorf("SubscriptionLost(%s) = %v, want %d", tt.reason, got, n)
				}
				// The ended subscription's closed channel is no message.
				if got := e.m.get("malformed:result_channel"); got != 0 {
					t.Errorf("MalformedMessage(result_channel) = %v after subscriptions ended, want 0", got)
				}
			})
		})
	}
}

// A job too large to queue is refused before any subscription.
func TestGatewayRefusesJobTooLargeToQueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		p := &producerFunc{enqueue: e.q.Enqueue}
		g := e.gateway(p)
		job := newJob("huge-1")
		job.Payload.Messages[0].Content = string(make([]byte, protocol.MaxJobBytes))
		ops := e.res.Ops()
		r, err := g.Spill(context.Background(), job)
		var prob *protocol.Problem
		if r != nil || !errors.As(err, &prob) || prob.Slug() != protocol.ProblemBodyTooLarge || prob.Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("Spill = %v, %v; want body-too-large", r, err)
		}
		if n := e.res.Ops() - ops; n != 0 || p.calls.Load() != 0 {
			t.Errorf("a refused Spill made %d result-channel calls and %d enqueues, want none", n, p.calls.Load())
		}
		if got := e.m.get("rejected:too_large"); got != 1 {
			t.Errorf("QueueRejected(too_large) = %d, want 1", got)
		}
	})
}

// limitedProducer is a producer stating a job limit (failover.JobLimiter).
type limitedProducer struct {
	*producerFunc
	limit int
}

func (p limitedProducer) MaxJobBytes() int { return p.limit }

// A queue stating a lower job limit (Kafka's record size) refuses a job
// over it with 413 at once, naming the limit, before any subscription;
// a job under it is queued.
func TestGatewayRefusesJobOverQueueLimit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		p := limitedProducer{producerFunc: &producerFunc{enqueue: e.q.Enqueue}, limit: 4096}
		g := e.gateway(p)
		job := newJob("big-1")
		job.Payload.Messages[0].Content = strings.Repeat("x", 5000)
		ops := e.res.Ops()
		r, err := g.Spill(context.Background(), job)
		var prob *protocol.Problem
		if r != nil || !errors.As(err, &prob) || prob.Status != http.StatusRequestEntityTooLarge || !strings.Contains(prob.Detail, "4096 bytes") {
			t.Fatalf("Spill = %v, %v; want 413 body-too-large naming the 4096-byte limit", r, err)
		}
		if n := e.res.Ops() - ops; n != 0 || p.calls.Load() != 0 {
			t.Errorf("a refused Spill made %d result-channel calls and %d enqueues, want none", n, p.calls.Load())
		}
		spill(t, g, "small-1")
		if p.calls.Load() != 1 {
			t.Errorf("a job under the limit was not enqueued")
		}
		if got := e.m.get("rejected:too_large"); got != 1 {
			t.Errorf("QueueRejected(too_large) = %d, want 1", got)
		}
	})
}

// A queue that refuses a job as too large at Enqueue (its limit lowered
// after the gateway checked) gives 413, not the 503 "retry shortly" of
// an unavailable queue, and nothing stays subscribed.
func TestGatewayEnqueueTooLargeIs413(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		p := limitedProducer{producerFunc: &producerFunc{enqueue: func(context.Context, string, []byte) error {
			return fmt.Errorf("kafka: produce: %w", failover.ErrJobTooLarge)
		}}, limit: 1 << 20}
		g := e.gateway(p)
		r, err := g.Spill(context.Background(), newJob("refused-1"))
		var prob *protocol.Problem
		if r != nil || !errors.As(err, &prob) || prob.Slug() != protocol.ProblemBodyTooLarge || prob.Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("Spill = %v, %v; want 413 body-too-large", r, err)
		}
		if e.m.get("rejected:too_large") != 1 || e.m.get("rejected:enqueue_failed") != 0 {
			t.Errorf("rejections %v, want one too_large and no enqueue_failed", e.m.n)
		}
		listened, err := e.res.PublishResult(context.Background(), "refused-1", []byte(`SIGNAL:HEARTBEAT:1`))
		if err != nil || listened {
			t.Errorf("after the refusal a publish was heard (%v, %v): the subscription stayed", listened, err)
		}
	})
}

// TestGatewayGapEndsStream: a chunk that never comes ends the stream with
// stream-gap one heartbeat after the gap opened, and the done behind the
// gap never reaches the client.
func TestGatewayGapEndsStream(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		g := e.gateway(e.q)
		r := spill(t, g, "gap-1")
		e.publish("gap-1", `BATCH:1:[{"seq":1,"content":"a"}]`)
		if res := nextResult(t, r, time.Second); res.Kind != protocol.KindBatch {
			t.Fatalf("result %+v, want the first batch", res)
		}
		e.publish("gap-1", `BATCH:1:[{"seq":3,"content":"c"}]`)
		e.publish("gap-1", `SIGNAL:DONE:1:3`)
		opened := time.Now()
		synctest.Wait()
		select {
		case res := <-r.Results():
			t.Fatalf("relay passed %+v across a gap", res)
		default:
		}
		select {
		case <-r.Done():
		case res := <-r.Results():
			t.Fatalf("relay passed %+v across a gap", res)
		case <-time.After(time.Minute):
			t.Fatal("relay did not give up on a gap")
		}
		if waited := time.Since(opened); waited != gwHeartbeat {
			t.Errorf("gave up %v after the gap opened, want one heartbeat (%v)", waited, gwHeartbeat)
		}
		if p := r.Problem(); p == nil || p.Slug() != protocol.ProblemStreamGap || p.Status != http.StatusServiceUnavailable {
			t.Fatalf("problem %+v, want stream-gap 503", p)
		}
		if got := e.m.get("gap:" + gateway.GapBroken); got != 1 {
			t.Errorf("StreamGap(broken) = %d, want 1", got)
		}
	})
}

// TestGatewayGapHeals: the missing batch arriving late (a retried publish
// overtaken) closes the gap, and the answer completes.
func TestGatewayGapHeals(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		g := e.gateway(e.q)
		r := spill(t, g, "heal-1")
		e.publish("heal-1", `BATCH:1:[{"seq":1,"content":"a"}]`)
		e.publish("heal-1", `BATCH:1:[{"seq":3,"content":"c"}]`)
		testutil.AdvanceFakeClock(gwHeartbeat / 2)
		e.publish("heal-1", `BATCH:1:[{"seq":2,"content":"b"}]`)
		e.publish("heal-1", `BATCH:1:[{"seq":2,"content":"b"}]`) // a retried publish's copy
		e.publish("heal-1", `SIGNAL:DONE:1:3`)
		var got string
		for {
			res := nextResult(t, r, time.Second)
			if res.Kind == protocol.KindDone {
				break
			}
			for _, c := range res.Chunks {
				got += c.Content
			}
		}
		if got != "abc" {
			t.Errorf("answer %q, want abc", got)
		}
		if healed, broken, dup := e.m.get("gap:"+gateway.GapHealed), e.m.get("gap:"+gateway.GapBroken),
			e.m.get("dropped:"+gateway.ResultDuplicate); healed != 1 || broken != 0 || dup != 1 {
			t.Errorf("StreamGap healed %d broken %d, ResultDropped(duplicate) %d; want 1, 0, 1", healed, broken, dup)
		}
	})
}

// TestGatewayFencesOlderAttempt: after a takeover, the old worker's
// chunks and done are dropped and do not count as signs of life.
func TestGatewayFencesOlderAttempt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		g := e.gateway(e.q)
		r := spill(t, g, "fence-1")
		e.publish("fence-1", `BATCH:1:[{"seq":1,"content":"a"}]`)
		nextResult(t, r, time.Second)
		e.publish("fence-1", `SIGNAL:HEARTBEAT:2`)
		e.publish("fence-1", `SIGNAL:RESET:{"attempt":2}`)
		e.publish("fence-1", `BATCH:1:[{"seq":2,"content":"b"}]`)
		e.publish("fence-1", `SIGNAL:DONE:1:2`)
		e.publish("fence-1", `BATCH:2:[{"seq":1,"content":"x"}]`)
		e.publish("fence-1", `SIGNAL:DONE:2:1`)
		var kinds []string
		var got string
		for {
			res := nextResult(t, r, time.Second)
			kinds = append(kinds, res.Kind.String())
			if res.Kind == protocol.KindDone {
				break
			}
			for _, c := range res.Chunks {
				got += c.Content
			}
		}
		want := []string{"reset", "heartbeat", "batch", "done"}
		if fmt.Sprint(kinds) != fmt.Sprint(want) || got != "x" {
			t.Errorf("relay passed %v with chunks %q, want %v and %q", kinds, got, want, "x")
		}
		if n := e.m.get("dropped:" + gateway.ResultStale); n != 2 {
			t.Errorf("ResultDropped(stale_attempt) = %d, want 2 (attempt 1's batch and done)", n)
		}
	})
}

// prioProducer records the line each job was put in.
type prioProducer struct {
	producerFunc
	mu    sync.Mutex
	lines []protocol.Priority
}

func (p *prioProducer) EnqueuePriority(ctx context.Context, requestID string, prio protocol.Priority, body []byte) error {
	p.mu.Lock()
	p.lines = append(p.lines, prio)
	p.mu.Unlock()
	return p.enqueue(ctx, requestID, body)
}

// A queue with a line per priority gets each job in its priority's line;
// one without keeps getting Enqueue.
func TestGatewayEnqueuesInThePriorityLine(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := &prioProducer{producerFunc: producerFunc{enqueue: e.q.Enqueue}}
	g := e.gateway(p)
	for _, prio := range []protocol.Priority{protocol.PriorityHigh, "", protocol.PriorityLow} {
		job := newJob("line-" + string(prio))
		job.Priority = prio
		r, err := g.Spill(context.Background(), job)
		if err != nil {
			t.Fatalf("Spill: %v", err)
		}
		t.Cleanup(func() { r.Close(true) })
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if want := []protocol.Priority{protocol.PriorityHigh, "", protocol.PriorityLow}; !slices.Equal(p.lines, want) || p.calls.Load() != 0 {
		t.Errorf("lines %q and %d plain Enqueue calls, want %q and none", p.lines, p.calls.Load(), want)
	}
	plain := &producerFunc{enqueue: e.q.Enqueue}
	spill(t, e.gateway(plain), "plain")
	if plain.calls.Load() != 1 {
		t.Errorf("a queue without lines got %d Enqueue calls, want 1", plain.calls.Load())
	}
}

// A waiting job's relay has no goroutine until its worker speaks: 200
// waiting streams add none, and a message starts exactly the relay it is
// for, which then relays it. Not parallel, and outside a bubble, so the
// process's goroutine count is this test's.
func TestWaitingRelaysHaveNoGoroutine(t *testing.T) {
	e := newEnv(t)
	g, err := gateway.New(gateway.Config{QueueTimeout: time.Hour, WorkerHeartbeat: time.Second, ReclaimIdle: 5 * time.Second},
		gateway.Deps{Producer: e.q, Results: e.res, Canceller: e.res, Metrics: e.m, Log: testutil.DiscardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	relays := make([]failover.Relay, 200)
	for i := range relays {
		relays[i] = spill(t, g, fmt.Sprintf("waiting-%d", i))
	}
	if added := runtime.NumGoroutine() - before; added > 10 {
		t.Fatalf("200 waiting relays added %d goroutines, want none of their own", added)
	}
	e.publish("waiting-7", "BATCH:1:[{\"seq\":1,\"content\":\"Hel\"}]")
	if res := nextResult(t, relays[7], 10*time.Second); res.Kind != protocol.KindBatch || res.Chunks[0].Content != "Hel" {
		t.Fatalf("relay 7 got %+v, want its chunk", res)
	}
	if added := runtime.NumGoroutine() - before; added < 1 || added > 11 {
		t.Fatalf("after one worker spoke: %d goroutines added, want the one relay's", added)
	}
}

// gatedQuota is a gateway.Quota and QuotaBatch whose releases block until
// the test lets each call answer; it records the jobs of every call.
type gatedQuota struct {
	gate  chan struct{}
	mu    sync.Mutex
	calls [][]string // request ids per release call
}

func (q *gatedQuota) Reserve(context.Context, string, string, int, time.Duration) (*protocol.Problem, error) {
	return nil, nil
}

func (q *gatedQuota) Release(ctx context.Context, identity, requestID string) error {
	return q.ReleaseMany(ctx, []string{identity}, []string{requestID})
}

func (q *gatedQuota) ReleaseMany(_ context.Context, _, requestIDs []string) error {
	q.mu.Lock()
	q.calls = append(q.calls, slices.Clone(requestIDs))
	q.mu.Unlock()
	<-q.gate
	return nil
}

func (q *gatedQuota) released() [][]string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.calls)
}

// A job that left the queue is uncounted off the relay's path: the
// worker's first message reaches the client while the quota's release is
// still waiting for Redis, and the jobs that left meanwhile share the next
// release call.
func TestGatewayReleasesQuotaOffTheRelaysPath(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		quota := &gatedQuota{gate: make(chan struct{})}
		defer close(quota.gate) // a failed test leaves no release blocked
		g, err := gateway.New(gatewayConfig(), gateway.Deps{
			Producer: e.q, Results: e.res, Canceller: e.res, Quota: quota, Metrics: e.m, Log: testutil.DiscardLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{"rel-1", "rel-2", "rel-3", "rel-4"}
		relays := make([]failover.Relay, len(ids))
		for i, id := range ids {
			relays[i] = spill(t, g, id)
		}
		e.publish("rel-1", "SIGNAL:HEARTBEAT:1")
		e.publish("rel-1", `BATCH:1:[{"seq":1,"content":"a"}]`)
		// The release of rel-1 blocks; its messages go out all the same.
		for _, want := range []protocol.ResultKind{protocol.KindHeartbeat, protocol.KindBatch} {
			if res := nextResult(t, relays[0], time.Second); res.Kind != want {
				t.Fatalf("rel-1 relayed %+v, want a %v while the release waits", res, want)
			}
		}
		synctest.Wait()
		if got := quota.released(); len(got) != 1 || !slices.Equal(got[0], []string{"rel-1"}) {
			t.Fatalf("release calls %v, want [[rel-1]] in flight", got)
		}
		for i, id := range ids[1:] {
			e.publish(id, "SIGNAL:HEARTBEAT:1")
			e.publish(id, `BATCH:1:[{"seq":1,"content":"a"}]`)
			for _, want := range []protocol.ResultKind{protocol.KindHeartbeat, protocol.KindBatch} {
				if res := nextResult(t, relays[i+1], time.Second); res.Kind != want {
					t.Fatalf("%s relayed %+v, want a %v", id, res, want)
				}
			}
		}
		quota.gate <- struct{}{} // rel-1's call answers; the three others go in one
		synctest.Wait()
		quota.gate <- struct{}{}
		g.Wait()
		got := quota.released()
		if len(got) != 2 || !slices.Equal(got[1], []string{"rel-2", "rel-3", "rel-4"}) {
			t.Fatalf("release calls %v, want [[rel-1] [rel-2 rel-3 rel-4]]", got)
		}
		// Each job is released once: a relay's Close does not release again.
		for _, r := range relays {
			r.Close(true)
		}
		g.Wait()
		if n := len(quota.released()); n != 2 {
			t.Fatalf("%d release calls after Close, want still 2", n)
		}
	})
}

// watchedSubscriber is the env's result channel with each SubscribeResults
// announced on subscribed (once) and, when fail is set, failing.
type watchedSubscriber struct {
	*memresults.Memory
	subscribed chan struct{}
	once       sync.Once
	fail       error
}

func (s *watchedSubscriber) SubscribeResults(ctx context.Context, requestID string) (failover.ResultSubscription, error) {
	s.once.Do(func() { close(s.subscribed) })
	if s.fail != nil {
		return nil, s.fail
	}
	return s.Memory.SubscribeResults(ctx, requestID)
}

// scriptedQuota is a gateway.Quota whose Reserve answers problem (nil:
// granted) after it noted whether the job's subscription was already
// asked for: it waits up to a second of the bubble's clock for it.
type scriptedQuota struct {
	subscribed  <-chan struct{}
	problem     *protocol.Problem
	overlapped  atomic.Bool
	releaseCall atomic.Int32
}

func (q *scriptedQuota) Reserve(context.Context, string, string, int, time.Duration) (*protocol.Problem, error) {
	select {
	case <-q.subscribed:
		q.overlapped.Store(true)
	case <-time.After(time.Second):
	}
	return q.problem, nil
}

func (q *scriptedQuota) Release(context.Context, string, string) error {
	q.releaseCall.Add(1)
	return nil
}

func (e *env) gatewayWith(sub failover.ResultSubscriber, quota gateway.Quota) *gateway.Gateway {
	e.tb.Helper()
	g, err := gateway.New(gatewayConfig(), gateway.Deps{
		Producer: e.q, Results: sub, Canceller: e.res, Quota: quota, Metrics: e.m, Log: testutil.DiscardLogger(),
	})
	if err != nil {
		e.tb.Fatalf("gateway.New: %v", err)
	}
	return g
}

// The quota's count and the result channel's subscription are asked for
// together, not one after the other: a queued stream's first chunk waits
// for one round trip fewer. The job is enqueued once both answered.
func TestGatewayReservesAndSubscribesTogether(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		sub := &watchedSubscriber{Memory: e.res, subscribed: make(chan struct{})}
		quota := &scriptedQuota{subscribed: sub.subscribed}
		r := spill(t, e.gatewayWith(sub, quota), "both-1")
		if !quota.overlapped.Load() {
			t.Fatal("Reserve answered before the subscription was asked for: the two ran one after the other")
		}
		if !e.res.Subscribed("both-1") || e.depth() != 1 {
			t.Fatalf("subscribed %v, queue depth %d; want subscribed and the job enqueued", e.res.Subscribed("both-1"), e.depth())
		}
		e.publish("both-1", `BATCH:1:[{"seq":1,"content":"a"}]`)
		if res := nextResult(t, r, time.Second); res.Kind != protocol.KindBatch {
			t.Fatalf("relayed %+v, want the batch", res)
		}
	})
}

// A job the quota refuses leaves no subscription behind and is not
// enqueued; a failed subscribe gives the quota's count back.
func TestGatewayUndoesTheOtherHalfOfAdmission(t *testing.T) {
	t.Parallel()
	t.Run("quota refuses", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			sub := &watchedSubscriber{Memory: e.res, subscribed: make(chan struct{})}
			quota := &scriptedQuota{subscribed: sub.subscribed, problem: protocol.TooManyQueued(3)}
			_, err := e.gatewayWith(sub, quota).Spill(context.Background(), newJob("refused-1"))
			if p, ok := errors.AsType[*protocol.Problem](err); !ok || p.Type != protocol.TooManyQueued(3).Type {
				t.Fatalf("Spill: %v, want the quota's too-many-queued", err)
			}
			synctest.Wait()
			if e.res.Subscribed("refused-1") || e.depth() != 0 {
				t.Fatalf("subscribed %v, queue depth %d after a refusal; want neither", e.res.Subscribed("refused-1"), e.depth())
			}
			if n := quota.releaseCall.Load(); n != 0 {
				t.Errorf("%d quota releases of a job never counted, want 0", n)
			}
		})
	})
	t.Run("subscribe fails", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t)
			sub := &watchedSubscriber{Memory: e.res, subscribed: make(chan struct{}), fail: errors.New("redis down")}
			quota := &scriptedQuota{subscribed: sub.subscribed}
			_, err := e.gatewayWith(sub, quota).Spill(context.Background(), newJob("nosub-1"))
			if p, ok := errors.AsType[*protocol.Problem](err); !ok || p.Status != http.StatusServiceUnavailable {
				t.Fatalf("Spill: %v, want queue-unavailable", err)
			}
			if n := quota.releaseCall.Load(); n != 1 || e.depth() != 0 {
				t.Fatalf("%d quota releases, queue depth %d; want the count given back once and nothing enqueued", n, e.depth())
			}
			if got := e.m.get("rejected:subscribe_failed"); got != 1 {
				t.Errorf("rejected:subscribe_failed %d, want 1", got)
			}
		})
	})
}
