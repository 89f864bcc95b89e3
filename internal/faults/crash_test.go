package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestAPICrashOrphansCancelled (the api crash): two api processes share
// the pool and the queue; one is SIGKILLed while its queued answers
// stream. Nothing tells the workers: they learn it from their next publish
// that nobody hears (PUBLISH to a channel without subscribers), so each
// orphaned job, running or still waiting, is cancelled within a heartbeat
// of the crash or of its start, and its slot returns. The dead api's own
// direct-path slots return when their leases expire. The other api's
// streams all complete.
func TestAPICrashOrphansCancelled(t *testing.T) {
	t.Parallel()
	sys := newSystem(t, redistest.Start(t), answer{tokens: 100, interval: 50 * time.Millisecond, seed: 21}, map[string]string{
		"CONNECTION_POOL_SIZE": "10", "CONNECTION_POOL_PER_USER": "10", "WORKER_CONCURRENCY": "8",
		"QUEUE_FAILOVER_TIMEOUT_SECONDS": "40",
	})
	survivor, victim := sys.api(nil), sys.api(nil)
	c1, c2 := sys.consumer(nil), sys.consumer(nil)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()

	// The victim first takes two slots directly with long answers (5 s),
	// so it holds leases when it dies; then both apis get short answers
	// (1 s), most of them queued behind the full pool.
	var onSurvivor, onVictim []*clientStream
	for i := range 2 {
		onVictim = append(onVictim, sys.open(ctx, victim.URL(), fmt.Sprintf("victim long %d", i), fmt.Sprintf("vl%d", i), 0))
	}
	testutil.Eventually(t, 20*time.Second, func() bool {
		return onVictim[0].chunks.Load() > 0 && onVictim[1].chunks.Load() > 0
	}, "the victim's direct streams started")
	const perAPI, short = 14, 20
	for i := range perAPI {
		onVictim = append(onVictim, sys.open(ctx, victim.URL(), fmt.Sprintf("victim prompt %d", i), fmt.Sprintf("v%d", i), short))
		onSurvivor = append(onSurvivor, sys.open(ctx, survivor.URL(), fmt.Sprintf("survivor prompt %d", i), fmt.Sprintf("s%d", i), short))
	}
	// Strike once some of the victim's queued answers are mid-way.
	testutil.Eventually(t, 30*time.Second, func() bool {
		n := 0
		for _, cs := range onVictim {
			if _, path := cs.head(); path == protocol.PathQueued && cs.chunks.Load() >= 3 {
				n++
			}
		}
		return n >= 2
	}, "two of the victim's queued answers streaming")
	leases, err := sys.liveLeases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victimLeases := leasesOf(leases, victim.cmd.Process.Pid)
	killed := time.Now()
	victim.Kill()
	if victimLeases == 0 {
		t.Fatal("the victim held no slot at the crash; the scenario needs its direct streams running")
	}
	waitAll(t, onVictim, 10*time.Second) // their connections are gone
	// Which of the victim's queued streams were orphaned, and which of
	// those were running (had chunks) at the crash.
	running := map[string]bool{}
	var orphans []string
	for _, cs := range onVictim {
		// A stream that got its done is no orphan, even when the done
		// reached the client just after the kill was sent.
		if cs.path != protocol.PathQueued || cs.rep.Terminal == protocol.EventDone {
			continue
		}
		orphans = append(orphans, cs.id)
		running[cs.id] = cs.chunks.Load() > 0
	}
	if len(orphans) == 0 {
		t.Fatal("the victim had no queued stream open at the crash")
	}

	// The victim's direct slots come back once their leases expire.
	var victimSlotsBack time.Duration
	testutil.Eventually(t, procLeaseTTL+10*time.Second, func() bool {
		ids, err := sys.liveLeases(ctx)
		if err == nil && leasesOf(ids, victim.cmd.Process.Pid) == 0 {
			victimSlotsBack = time.Since(killed)
			return true
		}
		return false
	}, "the dead api's leases expire")
	if victimSlotsBack > procLeaseTTL+3*time.Second {
		t.Errorf("the dead api's slots came back %v after the crash, want within the lease TTL (%v)", victimSlotsBack, procLeaseTTL)
	}

	waitAll(t, onSurvivor, 45*time.Second)
	lost := 0
	for _, cs := range onSurvivor {
		if cs.outcome() != "done" {
			lost++
			t.Errorf("survivor's stream %s (%s) ended %q: %+v", cs.id, cs.path, cs.outcome(), cs.rep)
		}
	}

	// Every orphan was cancelled by the worker that picked it up, and its
	// entry left the queue: nothing waits or runs for the dead api.
	rdbCtx, rdbCancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rdbCancel()
	testutil.Eventually(t, 20*time.Second, func() bool {
		n, err := sys.rdb.XLen(rdbCtx, redisstream.StreamKey(queuePrefix)).Result()
		return err == nil && n == 0
	}, "the queue empties")
	cancelled := cancellations(c1, c2)
	var worst time.Duration
	for _, id := range orphans {
		at, ok := cancelled[id]
		if !ok {
			t.Errorf("orphaned job %s (running at the crash: %v) was never cancelled for lack of a listener", id, running[id])
			continue
		}
		if running[id] {
			worst = max(worst, at.Sub(killed))
		}
	}
	if worst > orphanCancelBound {
		t.Errorf("a running orphan was cancelled %v after the crash, want within a heartbeat (%v; bound on a loaded machine %v)",
			worst, procHeartbeat, orphanCancelBound)
	}
	testutil.Eventually(t, procLeaseTTL+10*time.Second, func() bool {
		ids, err := sys.liveLeases(ctx)
		return err == nil && len(ids) == 0
	}, "every slot back once the survivor's streams ended")

	var f figures
	f.add("survivor_streams", len(onSurvivor))
	f.add("survivor_outcomes", tallyStreams(onSurvivor))
	f.add("orphans", len(orphans))
	nRunning := 0
	for _, r := range running {
		if r {
			nRunning++
		}
	}
	f.add("orphans_running", nRunning)
	f.add("orphans_cancelled", len(orphans)-countMissing(orphans, cancelled))
	f.add("worst_cancel_after_crash", worst)
	f.add("victim_leases_at_crash", victimLeases)
	f.add("victim_slots_back_after", victimSlotsBack)
	f.add("lost", lost)
	f.log(t, "api-crash")
}

func countMissing(ids []string, m map[string]time.Time) int {
	n := 0
	for _, id := range ids {
		if _, ok := m[id]; !ok {
			n++
		}
	}
	return n
}
