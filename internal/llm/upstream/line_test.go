package upstream

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// callerCtx is a context whose calls are for identity, queued at since.
func callerCtx(ctx context.Context, identity string, since time.Time) context.Context {
	return llm.WithCaller(ctx, llm.Caller{Identity: identity, Since: since})
}

// Calls waiting for an upstream slot are served as workers are given pool
// slots: round-robin between identities (the one holding fewest calls
// first), oldest first within one. With u holding a slot and two older
// waiters of u ahead of v's, the freed slot goes to v's waiter; then u's
// in FIFO order.
func TestWaitersServedRoundRobinBetweenIdentities(t *testing.T) {
	t.Parallel()
	mk := newMock(t)
	specs := specsFor([]*mockUpstream{mk}, 2)
	b, err := New(specs, Config{}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := time.Now()
	heldU, err := b.TryAcquire(callerCtx(ctx, "u", base), chat("x"))
	if err != nil {
		t.Fatal(err)
	}
	heldH, err := b.TryAcquire(callerCtx(ctx, "h", base), chat("x"))
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		name string
		r    *Reservation
	}
	granted := make(chan grant, 3)
	for i, name := range []string{"u1", "u2", "v1"} {
		go func() {
			r, err := b.Acquire(callerCtx(ctx, name[:1], base.Add(time.Duration(i+1)*time.Millisecond)), chat("x"))
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			granted <- grant{name, r}
		}()
		testutil.Eventually(t, 10*time.Second, func() bool { return b.line.count.Load() == int32(i+1) }, name+" waiting")
	}
	next := func(want string) *Reservation {
		t.Helper()
		select {
		case g := <-granted:
			if g.name != want {
				t.Fatalf("%s served, want %s", g.name, want)
			}
			return g.r
		case <-time.After(20 * time.Second):
			t.Fatalf("nobody served; want %s", want)
		}
		return nil
	}
	heldH.Release()
	r := next("v1") // u holds a slot already, v none
	r.Release()
	r = next("u1") // u holds 1, v 0, but only u waits: its oldest
	heldU.Release()
	next("u2").Release()
	r.Release()
}

// While calls wait for an upstream, a call that does not wait (the api's
// direct path) does not take a slot freed for them: it is refused and
// goes to the queue behind them, and the waiting call gets the slot.
func TestDirectCallLeavesSlotsToWaiters(t *testing.T) {
	t.Parallel()
	mk := newMock(t)
	b, err := New(specsFor([]*mockUpstream{mk}, 1), Config{}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held, err := b.TryAcquire(ctx, chat("x"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Reservation, 1)
	go func() {
		r, err := b.Acquire(callerCtx(ctx, "w", time.Now()), chat("x"))
		if err != nil {
			t.Errorf("waiter: %v", err)
			close(got)
			return
		}
		got <- r
	}()
	testutil.Eventually(t, 10*time.Second, func() bool { return b.line.count.Load() == 1 }, "waiter in line")
	held.Release()
	// Whether or not the waiter has been served yet, the direct call
	// finds nothing: the slot is the waiter's.
	if r, err := b.TryAcquire(ctx, chat("x")); !errors.Is(err, ErrNoUpstream) {
		if r != nil {
			r.Release()
		}
		t.Fatalf("direct call while a call waits: %v, want ErrNoUpstream", err)
	}
	select {
	case r := <-got:
		if r == nil {
			t.Fatal("waiter failed")
		}
		r.Release()
	case <-time.After(20 * time.Second):
		t.Fatal("waiter not served")
	}
	// Nobody waits now: direct calls take slots again.
	r, err := b.TryAcquire(ctx, chat("x"))
	if err != nil {
		t.Fatalf("direct call with nobody waiting: %v", err)
	}
	r.Release()
}

// A waiter that gives up leaves the line, and a slot granted just as it
// gave up is given back, not leaked.
func TestWaiterGivingUpLeavesNoSlot(t *testing.T) {
	t.Parallel()
	mk := newMock(t)
	b, err := New(specsFor([]*mockUpstream{mk}, 1), Config{}, Deps{NewProvider: openAIProvider})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	for i := range 20 {
		held, err := b.TryAcquire(ctx, chat("x"))
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			r, err := b.Acquire(wctx, chat("x"))
			if err == nil {
				r.Release()
			}
			done <- err
		}()
		testutil.Eventually(t, 10*time.Second, func() bool { return b.line.count.Load() == 1 }, fmt.Sprint("round ", i, " waiting"))
		// Release and give up at about the same time.
		go held.Release()
		cancel()
		<-done
		testutil.Eventually(t, 10*time.Second, func() bool {
			return b.line.count.Load() == 0 && b.caps.Load(0) == 0
		}, fmt.Sprint("round ", i, ": line empty and slot free"))
	}
}
