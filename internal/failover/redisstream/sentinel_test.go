package redisstream

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestCarriesOnThroughSentinelFailover: under a steady load of enqueues
// and fetches, the Sentinel-managed primary fails over. Calls may fail for
// a moment; enqueues succeed again within a few seconds, and every job
// whose enqueue was acknowledged is delivered: none is lost.
func TestCarriesOnThroughSentinelFailover(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	prefix := redistest.Prefix(t)
	producer := newShardedQueue(t, s.Client(t), prefix, "producer", 2)
	consumer := newShardedQueue(t, s.Client(t), prefix, "consumer", 2)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()

	var (
		mu       sync.Mutex
		acked    = map[string]bool{} // enqueues Redis acknowledged
		seen     = map[string]bool{} // jobs delivered to the consumer
		failures int
	)
	stopLoad := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // consumer: fetch, ack; a failed ack is redelivered later
		for ctx.Err() == nil {
			fctx, fcancel := context.WithTimeout(ctx, 2*time.Second)
			ds, err := consumer.Fetch(fctx, 10)
			fcancel()
			if err != nil {
				waitCtx(ctx, 20*time.Millisecond)
				continue
			}
			for _, d := range ds {
				mu.Lock()
				seen[string(d.Body)] = true
				mu.Unlock()
				actx, acancel := context.WithTimeout(ctx, time.Second)
				_ = consumer.Ack(actx, d)
				acancel()
			}
		}
	})
	enqueue := func(i int) error {
		body := fmt.Sprintf("job-%05d", i)
		ectx, ecancel := context.WithTimeout(ctx, time.Second)
		defer ecancel()
		err := producer.Enqueue(ectx, body, []byte(body))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failures++
			return err
		}
		acked[body] = true
		return nil
	}
	next := 0
	wg.Go(func() { // producer: a job every 5ms until told to stop
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopLoad:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				_ = enqueue(i)
			}
		}
	})

	// Some load before the failover.
	waitCond(t, ctx, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) >= 50 }, "50 jobs delivered before the failover")
	s.Failover(t)
	switched := time.Now()
	// New enqueues succeed within a few seconds of the switch.
	waitCond(t, ctx, func() bool {
		mu.Lock()
		i := next
		next++
		mu.Unlock()
		return enqueue(i) == nil
	}, "an enqueue after the failover")
	if took := time.Since(switched); took > 5*time.Second {
		t.Errorf("first enqueue after the switch took %s, want a few seconds at most", took)
	}
	// More load after the failover, then stop and drain.
	mu.Lock()
	mark := len(acked)
	mu.Unlock()
	waitCond(t, ctx, func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= mark+50 }, "50 more enqueues after the failover")
	close(stopLoad)
	waitCond(t, ctx, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for body := range acked {
			if !seen[body] {
				return false
			}
		}
		return true
	}, "every acknowledged job delivered")
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d jobs acknowledged, %d delivered, %d enqueues failed during the failover", len(acked), len(seen), failures)
}

// waitCond waits until cond holds, failing the test when ctx's deadline
// (or 30s without one) passes first.
func waitCond(t *testing.T, ctx context.Context, cond func() bool, what string) {
	t.Helper()
	within := 30 * time.Second
	if d, ok := ctx.Deadline(); ok {
		within = time.Until(d)
	}
	testutil.Eventually(t, within, cond, what)
}

// waitCtx pauses for d or until ctx ends: the consumer's back-off after a
// failed Fetch, not a wait for a condition.
func waitCtx(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}
