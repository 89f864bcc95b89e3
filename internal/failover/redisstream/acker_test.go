package redisstream

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// scriptGate counts the script calls of a client and holds the first one
// until released.
type scriptGate struct {
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (g *scriptGate) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (g *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
			if g.calls.Add(1) == 1 {
				close(g.entered)
				<-g.release
			}
		}
		return next(ctx, cmd)
	}
}

func (g *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (q *Queue) pendingAcks() int {
	q.acks.mu.Lock()
	defer q.acks.mu.Unlock()
	return len(q.acks.pending)
}

// TestAcksShareCalls: Acks that come while one is out go together in the
// next call, and each is still answered on its own: acknowledged, already
// acknowledged (nil again), or held by another member (ErrClaimLost, and
// the entry stays for its owner).
func TestAcksShareCalls(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gate := &scriptGate{entered: make(chan struct{}), release: make(chan struct{})}
	gated := redis.NewClient(&redis.Options{Addr: srv.Addr})
	gated.AddHook(gate)
	t.Cleanup(func() { _ = gated.Close() })
	a := newQueue(t, srv.Client(t), prefix, "a")
	b := newQueue(t, srv.Client(t), prefix, "b")
	const n = 40
	for range n + 1 {
		if err := a.Enqueue(ctx, "r", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	var da []failover.Delivery
	for len(da) < n {
		ds, err := a.Fetch(ctx, n-len(da))
		if err != nil {
			t.Fatal(err)
		}
		da = append(da, ds...)
	}
	db, err := b.Fetch(ctx, 1)
	if err != nil || len(db) != 1 {
		t.Fatalf("b.Fetch: %v, %v", db, err)
	}
	if err := a.Ack(ctx, da[n-1]); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	// The same member on the gated client, so its script calls are counted.
	ga := newQueue(t, gated, prefix, "a")

	errs := make([]error, n+1)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = ga.Ack(ctx, da[0]) })
	select {
	case <-gate.entered:
	case <-ctx.Done():
		t.Fatal("the first Ack made no call")
	}
	for i := 1; i < n; i++ { // da[n-1] was acknowledged already
		wg.Go(func() { errs[i] = ga.Ack(ctx, da[i]) })
	}
	wg.Go(func() { errs[n] = ga.Ack(ctx, db[0]) })
	testutil.Eventually(t, 10*time.Second, func() bool { return ga.pendingAcks() == n }, "the other Acks wait for the first call")
	close(gate.release)
	wg.Wait()

	for i, err := range errs[:n] {
		if err != nil {
			t.Errorf("Ack %d: %v", i, err)
		}
	}
	if !errors.Is(errs[n], ErrClaimLost) {
		t.Errorf("Ack of b's entry by a: %v, want ErrClaimLost", errs[n])
	}
	if c := gate.calls.Load(); c != 2 {
		t.Errorf("%d script calls for %d Acks, want 2 (the first alone, the rest together)", c, n+1)
	}
	if d, err := a.Depth(ctx); err != nil || d != 1 {
		t.Fatalf("depth %d, %v; want 1 (b's job)", d, err)
	}
	if err := b.Ack(ctx, db[0]); err != nil {
		t.Fatalf("owner's Ack: %v", err)
	}
	if d, err := a.Depth(ctx); err != nil || d != 0 {
		t.Fatalf("depth %d, %v; want 0", d, err)
	}
}

// TestAckGivesUpWithItsContext: an Ack whose context ends while its call
// is out returns the context's error instead of waiting.
func TestAckGivesUpWithItsContext(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gate := &scriptGate{entered: make(chan struct{}), release: make(chan struct{})}
	gated := redis.NewClient(&redis.Options{Addr: srv.Addr})
	gated.AddHook(gate)
	t.Cleanup(func() { _ = gated.Close() })
	q := newQueue(t, gated, prefix, "a")
	if err := q.Enqueue(ctx, "r", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	ds, err := newQueue(t, srv.Client(t), prefix, "a").Fetch(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Fetch: %v, %v", ds, err)
	}
	actx, acancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- q.Ack(actx, ds[0]) }()
	select {
	case <-gate.entered:
	case <-ctx.Done():
		t.Fatal("the Ack made no call")
	}
	acancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Ack: %v, want context.Canceled", err)
	}
	close(gate.release)
	// The call still went out: the entry is acknowledged, as after a lost reply.
	testutil.Eventually(t, 10*time.Second, func() bool {
		d, err := q.Depth(ctx)
		return err == nil && d == 0
	}, "the entry is acknowledged")
}
