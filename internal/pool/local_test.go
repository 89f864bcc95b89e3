package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func TestLocalLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := NewLocal(3, 2)
	if err != nil {
		t.Fatal(err)
	}
	a1, err := p.TryAcquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.TryAcquire(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.TryAcquire(ctx, "a"); !errors.Is(err, ErrUserLimit) {
		t.Fatalf("third for a: got %v, want ErrUserLimit", err)
	}
	if _, err := p.TryAcquire(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.TryAcquire(ctx, "c"); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("fourth: got %v, want ErrPoolExhausted", err)
	}
	if s := p.Stats(); s.InUse != 3 || s.Capacity != 3 {
		t.Fatalf("stats %+v", s)
	}
	a1.Release()
	a1.Release() // idempotent: must not free a second slot
	if s := p.Stats(); s.InUse != 2 {
		t.Fatalf("after double release in use %d, want 2", s.InUse)
	}
	if _, err := p.TryAcquire(ctx, "c"); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func TestLocalRejectsBadSizes(t *testing.T) {
	t.Parallel()
	for _, c := range [][2]int{{0, 1}, {1, 0}, {-1, 5}} {
		if _, err := NewLocal(c[0], c[1]); err == nil {
			t.Errorf("NewLocal(%d,%d) accepted", c[0], c[1])
		}
	}
}

// A freed slot goes to the oldest waiter, never to a later TryAcquire.
func TestLocalWaitersFIFOAndNotStarved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, _ := NewLocal(1, 10)
	held, _ := p.TryAcquire(ctx, "x")

	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		// Start waiters one at a time so their arrival order is known.
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := p.Acquire(ctx, "w")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			l.Release()
		}()
		testutil.Eventually(t, 5*time.Second, func() bool { return p.Waiting() == i+1 }, "waiter queued")
	}
	held.Release()
	// The slot went straight to waiter 0; a direct request cannot jump it.
	if _, err := p.TryAcquire(ctx, "direct"); err == nil && p.Waiting() > 0 {
		t.Fatal("TryAcquire took a slot while waiters were queued")
	}
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d served, want %d", got, want)
		}
		want++
	}
}

func TestLocalAcquireCancelled(t *testing.T) {
	t.Parallel()
	p, _ := NewLocal(1, 1)
	held, _ := p.TryAcquire(context.Background(), "a")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(ctx, "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if p.Waiting() != 0 {
		t.Fatal("cancelled waiter left in queue")
	}
	held.Release()
	if s := p.Stats(); s.InUse != 0 {
		t.Fatalf("in use %d after all released", s.InUse)
	}
}

// Hammer the pool and check the limits with an independent counter.
func TestLocalNeverExceedsLimits(t *testing.T) {
	t.Parallel()
	const size, perUser = 8, 3
	p, _ := NewLocal(size, perUser)
	var global atomic.Int64
	var users [5]atomic.Int64
	var wg sync.WaitGroup
	for g := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := g % len(users)
			name := string(rune('a' + u))
			for i := range 200 {
				var l Lease
				var err error
				if i%2 == 0 {
					l, err = p.TryAcquire(context.Background(), name)
				} else {
					l, err = p.Acquire(context.Background(), name)
				}
				if err != nil {
					continue
				}
				if n := global.Add(1); n > size {
					t.Errorf("global %d > %d", n, size)
				}
				if n := users[u].Add(1); n > perUser {
					t.Errorf("user %s %d > %d", name, n, perUser)
				}
				users[u].Add(-1)
				global.Add(-1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	if s := p.Stats(); s.InUse != 0 {
		t.Fatalf("in use %d at end", s.InUse)
	}
}

// AcquireSince orders waiters by when their work was queued, not by when
// they called.
func TestLocalAcquireSinceOrdersByQueueTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, _ := NewLocal(1, 10)
	held, _ := p.TryAcquire(ctx, "x")
	base := time.Now()
	// Arrive in the order 2, 0, 1 with queue times 0 < 1 < 2.
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for n, i := range []int{2, 0, 1} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := p.AcquireSince(ctx, "w", base.Add(time.Duration(i)*time.Millisecond))
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			l.Release()
		}()
		testutil.Eventually(t, 5*time.Second, func() bool { return p.Waiting() == n+1 }, "waiter queued")
	}
	held.Release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter queued at %d served, want %d", got, want)
		}
		want++
	}
}

// AcquireOrDefer turns a caller away at its per-user limit, at once and
// when the limit is reached while it waits for a global slot; a caller
// with room waits for the global slot as Acquire does.
func TestLocalAcquireOrDefer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := NewLocal(2, 1)
	if err != nil {
		t.Fatal(err)
	}
	la, _ := p.TryAcquire(ctx, "a")
	if _, err := p.AcquireOrDefer(ctx, "a", time.Now()); !errors.Is(err, ErrUserLimit) {
		t.Fatalf("a at its limit: err %v, want ErrUserLimit", err)
	}
	lh, _ := p.TryAcquire(ctx, "h")
	la.Release()
	lb, err := p.TryAcquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := p.AcquireOrDefer(ctx, "b", time.Now())
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return p.Waiting() == 1 }, "b waits")
	lh.Release()
	if err := <-got; !errors.Is(err, ErrUserLimit) {
		t.Fatalf("b: err %v, want ErrUserLimit", err)
	}
	if p.Waiting() != 0 {
		t.Fatal("b still waiting")
	}
	go func() {
		l, err := p.AcquireOrDefer(ctx, "c", time.Now())
		if err == nil {
			l.Release()
		}
		got <- err
	}()
	if err := <-got; err != nil {
		t.Fatalf("c with room: %v", err)
	}
	lb.Release()
}

// SetLimit lowers the slots in use without touching held leases, and
// raising it again serves waiters at once.
func TestLocalSetLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := NewLocal(4, 4)
	if err != nil {
		t.Fatal(err)
	}
	var held []Lease
	for range 3 {
		l, err := p.TryAcquire(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	p.SetLimit(2)
	if s := p.Stats(); s.InUse != 3 || s.Capacity != 4 || s.Limit != 2 || s.Effective() != 2 {
		t.Fatalf("stats after SetLimit(2): %+v", s)
	}
	if _, err := p.TryAcquire(ctx, "b"); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("over a lowered limit: %v, want ErrPoolExhausted", err)
	}
	// One release leaves 2 in use: still at the limit.
	held[0].Release()
	if _, err := p.TryAcquire(ctx, "b"); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("at the lowered limit: %v, want ErrPoolExhausted", err)
	}
	got := make(chan Lease, 1)
	go func() {
		l, err := p.Acquire(ctx, "b")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return p.Waiting() == 1 }, "a waiter")
	p.SetLimit(3)
	select {
	case l := <-got:
		l.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("raising the limit did not serve the waiter")
	}
	// Bounds: at least 1, at most the size.
	p.SetLimit(0)
	if s := p.Stats(); s.Limit != 1 {
		t.Errorf("SetLimit(0): limit %d, want 1", s.Limit)
	}
	p.SetLimit(99)
	if s := p.Stats(); s.Limit != 4 || s.Effective() != 4 {
		t.Errorf("SetLimit(99): %+v, want limit 4", s)
	}
	if (Stats{InUse: 1, Capacity: 5}).Effective() != 5 {
		t.Error("a pool that does not adapt: Effective is not Capacity")
	}
}
