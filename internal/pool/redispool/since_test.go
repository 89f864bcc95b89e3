package redispool

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// AcquireSince places waiters, across processes, by when their work was
// queued: waiters arriving in the order 3,1,4,0,2 are served 0,1,2,3,4.
func TestAcquireSinceOrdersByQueueTimeAcrossInstances(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	admin := s.Client(t)
	cfg := Config{Prefix: redistest.Prefix(t), Size: 1, PerUser: 10, LeaseTTL: 5 * time.Second}
	ctx := context.Background()
	holder := newTestPool(t, s.Addr, cfg, nil, nil)
	procs := []*Pool{newTestPool(t, s.Addr, cfg, nil, nil), newTestPool(t, s.Addr, cfg, nil, nil)}
	held, err := holder.TryAcquire(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Minute)
	type grant struct {
		n int
		l pool.Lease
	}
	granted := make(chan grant, 5)
	var wg sync.WaitGroup
	wctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer func() { stop(); wg.Wait() }()
	for i, n := range []int{3, 1, 4, 0, 2} {
		p := procs[i%2]
		wg.Go(func() {
			l, err := p.AcquireSince(wctx, "w", base.Add(time.Duration(n)*time.Second))
			if err != nil {
				t.Errorf("W%d: %v", n, err)
				return
			}
			granted <- grant{n, l}
		})
		testutil.Eventually(t, 5*time.Second, func() bool {
			return zcard(t, admin, WaitersKey(cfg.Prefix)) == int64(i+1)
		}, fmt.Sprintf("waiter %d registered", n))
	}
	free := held
	for want := range 5 {
		free.Release()
		g := recv(t, granted, 5*time.Second, fmt.Sprintf("W%d served", want))
		if g.n != want {
			t.Fatalf("W%d served, want W%d (queue-time order)", g.n, want)
		}
		free = g.l
	}
	free.Release()
}
