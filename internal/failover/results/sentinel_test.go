package results_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// A worker's cancel watch on a Sentinel-managed Redis hears cancellations
// across a failover: while the demoted primary serves as a replica (Redis
// hands a PUBLISH on the primary to the replicas' subscribers too) and
// after it is gone (go-redis reconnects to the primary the Sentinels name
// and subscribes again). A cancellation announced while the watch
// reconnects may be missed; the cancel key still tells (Cancelled), and
// the watch keeps hearing later ones.
func TestWatchCancelsThroughSentinelFailover(t *testing.T) {
	t.Parallel()
	sen := redistest.StartSentinel(t)
	prefix := redistest.Prefix(t)
	pub, err := results.NewPublisher(prefix, sen.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := results.NewSubscriber(results.SubscriberConfig{Prefix: prefix}, sen.Client(t), testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	watch, err := pub.WatchCancels(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)

	// heardWithin reports whether the watch hears id within d.
	heardWithin := func(id string, d time.Duration) bool {
		timer := time.NewTimer(d)
		defer timer.Stop()
		for {
			select {
			case got := <-watch.C():
				if got == id {
					return true
				}
			case <-timer.C:
				return false
			}
		}
	}
	n := 0
	// heard announces cancellations until the watch hears one, within 20s.
	heard := func(stage string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			n++
			id := fmt.Sprintf("%s-%d", stage, n)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			err := sub.Cancel(ctx, id, time.Minute)
			cancel()
			if err != nil {
				continue // the switch is under way: announce again
			}
			if gone, err := pub.Cancelled(t.Context(), id); err != nil || !gone {
				t.Fatalf("%s: cancel key of %s: %v, %v", stage, id, gone, err)
			}
			if heardWithin(id, 500*time.Millisecond) {
				return
			}
		}
		t.Fatalf("%s: the watch heard no cancellation within 20s", stage)
	}
	heard("before")
	old := sen.Data[0]
	if addr, err := sen.PrimaryAddr(t.Context()); err != nil || addr != old.Addr {
		t.Fatalf("primary %s, %v; want %s", addr, err, old.Addr)
	}
	sen.Failover(t)
	heard("demoted")
	// The old primary goes away: the watch's connection to it breaks.
	old.Stop()
	heard("gone")
}
