package failover_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/pubsub"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
	"github.com/spillway-dev/spillway/internal/testutil"
)

// Gateway durations: silence after a worker spoke is 3·1s + 5s + 3·1s.
const (
	gwQueueTimeout = 2 * time.Second
	gwHeartbeat    = time.Second
	gwReclaimIdle  = 5 * time.Second
	gwSilence      = 6*gwHeartbeat + gwReclaimIdle
)

func gatewayConfig() failover.GatewayConfig {
	return failover.GatewayConfig{
		Prefix:          testPrefix,
		QueueTimeout:    gwQueueTimeout,
		WorkerHeartbeat: gwHeartbeat,
		ReclaimIdle:     gwReclaimIdle,
		RetryAfter:      3 * time.Second,
	}
}

func (e *env) subscriber() *pubsub.Subscriber {
	e.tb.Helper()
	s, err := pubsub.New(pubsub.Config{Shards: 2}, e.rdb, nil)
	if err != nil {
		e.tb.Fatalf("pubsub.New: %v", err)
	}
	e.tb.Cleanup(func() { _ = s.Close() })
	return s
}

func (e *env) gateway(p failover.Producer, sub *pubsub.Subscriber) *failover.Gateway {
	e.tb.Helper()
	g, err := failover.NewGateway(gatewayConfig(), p, sub, e.rdb, e.m, discardLog())
	if err != nil {
		e.tb.Fatalf("NewGateway: %v", err)
	}
	return g
}

func spill(tb testing.TB, g *failover.Gateway, id string) stream.Relay {
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
	n, err := e.rdb.Publish(context.Background(), failover.ResultChannel(testPrefix, id), msg).Result()
	if err != nil || n != 1 {
		e.tb.Fatalf("PUBLISH %q: %d receivers, %v; want the relay's subscription", msg, n, err)
	}
}

// nextResult returns the relay's next result, failing the test when none
// comes within d or the relay gave up.
func nextResult(tb testing.TB, r stream.Relay, d time.Duration) protocol.Result {
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

func isDone(r stream.Relay) bool {
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
		e := newEnv(t, 15*time.Second, 1)
		// A worker so fast that it answers while Enqueue is still running.
		var receivers atomic.Int64
		p := &producerFunc{enqueue: func(ctx context.Context, id string, body []byte) error {
			if _, err := protocol.DecodeJob(body); err != nil {
				return fmt.Errorf("enqueued a job that does not decode: %w", err)
			}
			n, err := e.rdb.Publish(ctx, failover.ResultChannel(testPrefix, id), `SIGNAL:DONE:{"request_id":"`+id+`"}`).Result()
			receivers.Store(n)
			return err
		}}
		g := e.gateway(p, e.subscriber())
		r := spill(t, g, "early-1")
		if n := p.calls.Load(); n != 1 {
			t.Fatalf("Spill enqueued %d times, want once", n)
		}
		if n := receivers.Load(); n != 1 {
			t.Fatalf("the DONE published from inside Enqueue reached %d subscribers, want 1: Spill enqueued before subscribing", n)
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
		e := newEnv(t, 15*time.Second, 1)
		g := e.gateway(e.q, e.subscriber()) // no worker takes the job
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
		if p == nil || p.Slug() != protocol.ProblemQueueTimeout || p.Status != http.StatusServiceUnavailable || p.RetryAfterSeconds < 1 {
			t.Fatalf("problem %+v, want queue-timeout, 503, retry_after ≥ 1", p)
		}
		if n := promtest.ToFloat64(e.m.QueueRejections.WithLabelValues("timeout")); n != 1 {
			t.Errorf("QueueRejections{reason=timeout} = %v, want 1", n)
		}
	})
}

func TestGatewayWorkerLost(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 1)
		g := e.gateway(e.q, e.subscriber())
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
		if n := promtest.ToFloat64(e.m.QueueRejections.WithLabelValues("timeout")); n != 0 {
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
				e := newEnv(t, 15*time.Second, 1)
				cancels := e.listenChannel(failover.CancelChannel(testPrefix))
				sub := e.subscriber()
				g := e.gateway(e.q, sub)
				r := spill(t, g, "close-1")
				r.Close(completed)
				r.Close(completed) // idempotent

				key := failover.CancelKey(testPrefix, "close-1")
				if completed {
					cancels.quiet(5 * time.Second)
					if e.mr.Exists(key) {
						t.Errorf("Close(true) set the cancel key %s", key)
					}
				} else {
					if m := cancels.must(5 * time.Second); m.raw != "close-1" {
						t.Errorf("cancel notice %q, want the request id", m.raw)
					}
					if !e.mr.Exists(key) {
						t.Fatalf("Close(false) did not set the cancel key %s", key)
					}
					if ttl, want := e.mr.TTL(key), gwQueueTimeout+gwReclaimIdle+6*gwHeartbeat; ttl != want {
						t.Errorf("cancel key TTL %v, want %v", ttl, want)
					}
				}
				synctest.Wait()
				if n := sub.Stats().Active; n != 0 {
					t.Errorf("%d subscriptions still active after Close", n)
				}
			})
		})
	}
}

func TestGatewaySkipsMalformedMessages(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 1)
		g := e.gateway(e.q, e.subscriber())
		start := time.Now()
		r := spill(t, g, "junk-1")
		for _, msg := range []string{"hello", `BATCH:[{"seq":0,"content":"x"}]`, "SIGNAL:ERROR:{}"} {
			e.publish("junk-1", msg)
		}
		synctest.Wait()
		if n := promtest.ToFloat64(e.m.MalformedMessages.WithLabelValues("result_channel")); n != 3 {
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
		if n := promtest.ToFloat64(e.m.MalformedMessages.WithLabelValues("result_channel")); n != 5 {
			t.Errorf("MalformedMessages{source=result_channel} = %v, want 5", n)
		}
	})
}

func TestGatewayAdmission(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 1)
		p := &producerFunc{enqueue: e.q.Enqueue}
		sub := e.subscriber()
		g := e.gateway(p, sub)
		refusal := protocol.NewProblem(protocol.ProblemQueueOverflow, "Queue Full", http.StatusServiceUnavailable, "later").WithRetryAfter(60)
		var refuse atomic.Bool
		refuse.Store(true)
		g.SetAdmission(func() *protocol.Problem {
			if refuse.Load() {
				return refusal
			}
			return nil
		})

		commands := e.mr.CommandCount()
		r, err := g.Spill(context.Background(), newJob("refused-1"))
		var prob *protocol.Problem
		if r != nil || !errors.As(err, &prob) || prob.Slug() != protocol.ProblemQueueOverflow || prob.RetryAfterSeconds != 60 {
			t.Fatalf("Spill = %v, %v; want the admission's problem", r, err)
		}
		synctest.Wait()
		if n := e.mr.CommandCount(); n != commands {
			t.Errorf("a refused Spill sent %d Redis commands, want none (no subscription)", n-commands)
		}
		if n := p.calls.Load(); n != 0 {
			t.Errorf("a refused Spill enqueued %d jobs", n)
		}
		if n := sub.Stats().Active; n != 0 {
			t.Errorf("%d subscriptions after a refused Spill", n)
		}

		refuse.Store(false)
		spill(t, g, "admitted-1")
		if n := p.calls.Load(); n != 1 {
			t.Errorf("an admitted Spill enqueued %d jobs, want 1", n)
		}
	})
}

func TestGatewaySubscriptionLost(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 1)
		sub := e.subscriber()
		g := e.gateway(e.q, sub)
		const n = 20
		relays := make([]stream.Relay, n)
		for i := range relays {
			relays[i] = spill(t, g, fmt.Sprintf("gone-%d", i))
		}
		if err := sub.Close(); err != nil {
			t.Fatalf("Subscriber.Close: %v", err)
		}
		for i, r := range relays {
			select {
			case <-r.Done():
			case <-time.After(time.Second):
				t.Fatalf("relay %d did not give up when its subscription ended", i)
			}
			if p := r.Problem(); p == nil || p.Slug() != protocol.ProblemQueueUnavailable || p.RetryAfterSeconds < 1 {
				t.Errorf("relay %d gave up with %+v, want queue-unavailable with retry_after", i, p)
			}
		}
		if got := promtest.ToFloat64(e.m.SubscriptionsLost.WithLabelValues("connection_lost")); got != n {
			t.Errorf("SubscriptionsLost{reason=connection_lost} = %v, want %d", got, n)
		}
		// The ended subscription's closed channel is no message.
		if got := promtest.ToFloat64(e.m.MalformedMessages.WithLabelValues("result_channel")); got != 0 {
			t.Errorf("MalformedMessages{source=result_channel} = %v after subscriptions ended, want 0", got)
		}
	})
}
