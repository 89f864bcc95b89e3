package worker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/pool"
)

func newLocalPool(tb testing.TB, size, perUser int) *pool.Local {
	tb.Helper()
	p, err := pool.NewLocal(size, perUser)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// The fairness property (docs/QUEUE.md, "Fairness"): with work waiting
// from several identities, worker slots go round-robin between them in the
// order they first had work waiting, FIFO within one identity.
func TestSchedulerRoundRobinBetweenIdentitiesFIFOWithin(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(newLocalPool(t, 10, 10), 1, 10)
		// A job holds the only worker slot while the others park.
		blocker, err := s.acquire(t.Context(), "zed", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		for _, name := range []string{"alice 1", "alice 2", "alice 3", "bob 1", "bob 2", "carol 1"} {
			wg.Go(func() {
				user := name[:len(name)-2]
				l, err := s.acquire(t.Context(), user, time.Now(), false)
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				time.Sleep(time.Second) // runs for a second on the fake clock
				l.Release()
			})
			synctest.Wait() // parked in this order
		}
		if n := s.parked(); n != 6 {
			t.Fatalf("%d parked, want 6", n)
		}
		blocker.Release()
		wg.Wait()
		want := []string{"alice 1", "bob 1", "carol 1", "alice 2", "bob 2", "alice 3"}
		if !slices.Equal(order, want) {
			t.Fatalf("start order %v, want %v", order, want)
		}
	})
}

// A job whose identity is at its per-user limit holds no worker slot:
// another identity's job starts at once with the only worker slot, and the
// set-aside job starts as soon as its identity has room again.
func TestSchedulerNeverHoldsAWorkerSlotForAJobThatCannotStart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newLocalPool(t, 10, 1)
		s := newScheduler(p, 1, 10)
		defer s.stop()
		// alice holds her one slot elsewhere (a direct stream on the api).
		elsewhere, err := p.TryAcquire(t.Context(), "alice")
		if err != nil {
			t.Fatal(err)
		}
		aliceStarted := make(chan time.Time, 1)
		go func() {
			l, err := s.acquire(t.Context(), "alice", time.Now(), false)
			if err != nil {
				t.Errorf("alice: %v", err)
				return
			}
			aliceStarted <- time.Now()
			l.Release()
		}()
		synctest.Wait()
		s.mu.Lock()
		busy := s.busy
		s.mu.Unlock()
		if busy != 0 {
			t.Fatalf("%d worker slots held while alice's job cannot start", busy)
		}
		start := time.Now()
		bob, err := s.acquire(t.Context(), "bob", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("bob waited %v for the only worker slot", waited)
		}
		bob.Release()
		synctest.Wait()
		select {
		case <-aliceStarted:
			t.Fatal("alice's job started while alice was at her limit")
		default:
		}
		released := time.Now()
		elsewhere.Release() // released outside this worker: the recheck finds it
		select {
		case at := <-aliceStarted:
			if d := at.Sub(released); d > deferRecheck {
				t.Fatalf("alice started %v after her slot was freed, want within %v", d, deferRecheck)
			}
		case <-time.After(time.Minute):
			t.Fatal("alice's job never started")
		}
	})
}

// A release by this worker lets the identity's next job start at once,
// without waiting for the recheck.
func TestSchedulerOwnReleaseStartsTheIdentitysNextJobAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(newLocalPool(t, 10, 1), 4, 10)
		defer s.stop()
		first, err := s.acquire(t.Context(), "alice", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			l, err := s.acquire(t.Context(), "alice", time.Now(), false)
			if err == nil {
				got <- time.Now()
				l.Release()
			}
		}()
		synctest.Wait()
		time.Sleep(time.Millisecond) // off the recheck's beat
		released := time.Now()
		first.Release()
		if at := <-got; at != released {
			t.Fatalf("next job started %v after the release", at.Sub(released))
		}
	})
}

// A parked job whose context ends leaves the line and holds nothing.
func TestSchedulerParkedJobGivesUpOnItsDeadline(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newLocalPool(t, 10, 1)
		s := newScheduler(p, 2, 10)
		defer s.stop()
		held, err := s.acquire(t.Context(), "alice", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		if _, err := s.acquire(ctx, "alice", time.Now(), false); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err %v, want the deadline", err)
		}
		if n := s.parked(); n != 0 {
			t.Fatalf("%d still parked", n)
		}
		held.Release()
		s.mu.Lock()
		busy := s.busy
		s.mu.Unlock()
		if busy != 0 || p.Stats().InUse != 0 {
			t.Fatalf("busy %d, pool in use %d after everything ended", busy, p.Stats().InUse)
		}
	})
}

// room: jobs parked behind their identity's limit do not count against
// the worker slots, up to maxParked; jobs waiting for a worker slot do.
func TestSchedulerRoom(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := newLocalPool(t, 10, 1)
		s := newScheduler(p, 2, 3)
		defer s.stop()
		if r := s.room(); r != 2 {
			t.Fatalf("room %d when empty, want 2", r)
		}
		// alice runs one job and parks three more behind her limit.
		s.took(1)
		run, err := s.acquire(t.Context(), "alice", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 3 {
			s.took(1)
			wg.Go(func() {
				defer s.finished()
				if l, err := s.acquire(t.Context(), "alice", time.Now(), false); err == nil {
					l.Release()
				}
			})
		}
		synctest.Wait()
		if r := s.room(); r != 1 {
			t.Fatalf("room %d with one running and three parked behind the limit, want 1", r)
		}
		s.took(1) // one more parked behind the limit reaches maxParked
		go func() {
			defer s.finished()
			if l, err := s.acquire(t.Context(), "alice", time.Now(), false); err == nil {
				l.Release()
			}
		}()
		synctest.Wait()
		if r := s.room(); r != 0 {
			t.Fatalf("room %d with maxParked parked, want 0", r)
		}
		run.Release()
		s.finished()
		wg.Wait()
	})
}

// A job taken over from a dead worker gets the next worker slot before
// every job parked earlier, and takeovers start among themselves in the
// order they came (docs/QUEUE.md, "Takeover").
func TestSchedulerTakeoversGoFirst(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(newLocalPool(t, 10, 10), 1, 10)
		blocker, err := s.acquire(t.Context(), "zed", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		for _, name := range []string{"alice new", "bob new", "carol takeover 1", "alice takeover 2"} {
			wg.Go(func() {
				user, _, _ := strings.Cut(name, " ")
				l, err := s.acquire(t.Context(), user, time.Now(), strings.Contains(name, "takeover"))
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				time.Sleep(time.Second)
				l.Release()
			})
			synctest.Wait()
		}
		if n := s.parked(); n != 4 {
			t.Fatalf("%d parked, want 4", n)
		}
		if n := s.takeoverRoom(); n != 1+10-2 {
			t.Errorf("takeover room %d with two takeovers parked, want %d", n, 1+10-2)
		}
		blocker.Release()
		wg.Wait()
		want := []string{"carol takeover 1", "alice takeover 2", "alice new", "bob new"}
		if !slices.Equal(order, want) {
			t.Fatalf("start order %v, want %v", order, want)
		}
	})
}

// countingPool counts the asks of each user.
type countingPool struct {
	*pool.Local
	mu   sync.Mutex
	asks map[string]int
}

func (p *countingPool) AcquireOrDefer(ctx context.Context, user string, since time.Time) (pool.Lease, error) {
	p.mu.Lock()
	p.asks[user]++
	p.mu.Unlock()
	return p.Local.AcquireOrDefer(ctx, user, since)
}

// The users of one API key share its per-user limit: once one of them is
// turned away, the key's other users are passed over too instead of each
// asking the pool in turn, and a release of the key's slot starts its next
// job.
func TestSchedulerPassesOverAKeysUsersTogether(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := &countingPool{Local: newLocalPool(t, 10, 1), asks: map[string]int{}}
		s := newScheduler(p, 4, 10)
		defer s.stop()
		first, err := s.acquire(t.Context(), "key:abc/user:a", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan string, 2)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		for _, user := range []string{"key:abc/user:b", "key:abc/user:c"} {
			go func() {
				l, err := s.acquire(ctx, user, time.Now(), false)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("%s: %v", user, err)
					}
					return
				}
				started <- user
				l.Release()
			}()
			synctest.Wait()
		}
		p.mu.Lock()
		asksB, asksC := p.asks["key:abc/user:b"], p.asks["key:abc/user:c"]
		p.mu.Unlock()
		if asksB != 1 || asksC != 0 {
			t.Fatalf("asks b %d c %d while the key is at its limit, want 1 and 0", asksB, asksC)
		}
		if len(started) != 0 {
			t.Fatalf("%s started beside a's slot of the same key", <-started)
		}
		other, err := s.acquire(t.Context(), "key:def/user:a", time.Now(), false)
		if err != nil {
			t.Fatal(err)
		}
		other.Release()
		first.Release()
		for range 2 {
			select {
			case <-started:
			case <-time.After(time.Minute):
				t.Fatal("the key's parked jobs never started")
			}
		}
	})
}
