package faults

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// shutdownNoSave stops the server as `SHUTDOWN NOSAVE` does (no snapshot;
// without AOF every key is gone) and starts it again on the same port.
// It returns when the new server answers.
func shutdownNoSave(tb testing.TB, srv *redistest.Server) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The server closes the connection instead of replying.
	if err := c.Do(ctx, "SHUTDOWN", "NOSAVE").Err(); err != nil && !errors.Is(err, redis.ErrClosed) &&
		!strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "connection reset") {
		tb.Fatalf("SHUTDOWN NOSAVE: %v", err)
	}
	srv.Restart(tb)
}

// hold lets the scenario run for d: the timing of the next fault, not a
// condition to wait for.
func hold(tb testing.TB, ctx context.Context, d time.Duration) {
	tb.Helper()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		tb.Fatalf("scenario out of time: %v", ctx.Err())
	}
}

// keysWithoutTTL returns every key that never expires.
func (s *system) keysWithoutTTL(ctx context.Context) ([]string, error) {
	var out []string
	iter := s.rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		ttl, err := s.rdb.PTTL(ctx, iter.Val()).Result()
		if err != nil {
			return nil, err
		}
		if ttl == -1 { // -2: gone meanwhile
			out = append(out, iter.Val())
		}
	}
	sort.Strings(out)
	return out, iter.Err()
}

// TestRedisRestartUnderLoad (scenario 3): two apis and two consumers
// under steady load, about half of it queued; Redis is shut down without
// saving and restarted within a second, and a while later one api is
// SIGKILLed. On the surviving api every stream ends in done or an
// explicit error (a refusal with a status, or an error event), never cut
// or short; new requests succeed again within 5 s of the restart; the dead
// api's queued jobs are cancelled; every slot comes back within the lease
// TTL once the load stops; the dead-letter queue stays empty; and no key
// is left that never expires, but the queue stream itself.
func TestRedisRestartUnderLoad(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	sys := newSystem(t, srv, answer{tokens: 40, interval: 25 * time.Millisecond, seed: 31}, map[string]string{
		"CONNECTION_POOL_SIZE": "24", "CONNECTION_POOL_PER_USER": "24", "WORKER_CONCURRENCY": "16",
		"POOL_LOCAL_FALLBACK_SIZE": "12", "QUEUE_FAILOVER_TIMEOUT_SECONDS": "20",
	})
	survivor, victim := sys.api(nil), sys.api(nil)
	c1, c2 := sys.consumer(nil), sys.consumer(nil)
	ctx, cancel := context.WithTimeout(t.Context(), 55*time.Second)
	defer cancel()
	began := time.Now()

	const clients = 24 // per api: 48 streams at once on a pool of 24
	onSurvivor := sys.load(ctx, survivor.URL(), "s", clients, 0)
	onVictim := sys.load(ctx, victim.URL(), "v", clients, 0)
	testutil.Eventually(t, 20*time.Second, func() bool {
		css, _ := onSurvivor.all()
		queued := 0
		for _, cs := range css {
			if _, path := cs.head(); path == protocol.PathQueued && cs.chunks.Load() > 0 {
				queued++
			}
		}
		return queued >= 5
	}, "queued streams under way")

	shutdownNoSave(t, srv)
	restarted := time.Now()

	// The "10 s later", scaled to the suite's short settings.
	hold(t, ctx, 3*time.Second)
	onVictim.stopStarting()
	runningAtKill := map[*clientStream]bool{}
	before, _ := onVictim.all()
	for _, cs := range before {
		runningAtKill[cs] = cs.chunks.Load() > 0
	}
	killed := time.Now()
	victim.Kill()
	onVictim.halt()
	victimStreams, _ := onVictim.all()

	hold(t, ctx, 5*time.Second) // load on the survivor after the crash
	onSurvivor.halt()
	ended := time.Now()
	streams, opened := onSurvivor.all()

	// Every stream on the surviving api ended explicitly.
	lost := 0
	for _, cs := range streams {
		if strings.HasPrefix(cs.outcome(), "lost") {
			lost++
			if lost <= 5 {
				t.Errorf("survivor's stream %s (%s) %s: %+v", cs.id, cs.path, cs.outcome(), cs.rep)
			}
		}
	}
	// New requests succeed within 5 s of the restart: every one opened
	// from then on completes.
	var afterRecovery, failedAfterRecovery int
	firstDone := time.Duration(-1)
	for i, cs := range streams {
		if opened[i].Before(restarted) {
			continue
		}
		if cs.outcome() == "done" && (firstDone < 0 || opened[i].Sub(restarted) < firstDone) {
			firstDone = opened[i].Sub(restarted)
		}
		if opened[i].Sub(restarted) >= 5*time.Second {
			afterRecovery++
			if cs.outcome() != "done" {
				failedAfterRecovery++
				t.Errorf("stream %s opened %v after the restart ended %q", cs.id, opened[i].Sub(restarted), cs.outcome())
			}
		}
	}
	if afterRecovery == 0 {
		t.Errorf("no request was opened 5 s or more after the restart; the load stopped too early")
	}

	// The dead api's jobs: none left in the queue, each cancelled by the
	// worker that held or picked it up.
	testutil.Eventually(t, 20*time.Second, func() bool {
		n, err := sys.rdb.XLen(ctx, redisstream.StreamKey(queuePrefix)).Result()
		return err == nil && n == 0
	}, "the queue empties")
	cancelled := cancellations(c1, c2)
	orphans, orphansCancelled, orphansFinished := 0, 0, 0
	var worst time.Duration
	for _, cs := range victimStreams {
		if cs.path != protocol.PathQueued || cs.rep.Terminal != "" {
			// Direct, or ended: answered (its done may have reached the
			// client just after the kill was sent), or ended by the restart.
			continue
		}
		orphans++
		at, ok := cancelled[cs.id]
		if !ok && time.Duration(sys.ans.tokens-int(cs.rep.Chunks))*sys.ans.interval < procHeartbeat {
			// Less of its answer was left than a heartbeat: its worker
			// may finish it (the queue empties above: it ended) before it
			// can learn that nobody listens. Nothing is left to cancel.
			orphansFinished++
			continue
		}
		if !ok {
			t.Errorf("the dead api's job %s (chunks %d, ended %v after the crash) was never cancelled; consumer logs:\n%s",
				cs.id, cs.rep.Chunks, cs.ended.Sub(killed), strings.Join(append(c1.mentions(cs.id), c2.mentions(cs.id)...), "\n"))
			continue
		}
		orphansCancelled++
		if runningAtKill[cs] {
			worst = max(worst, at.Sub(killed))
		}
	}
	if worst > orphanCancelBound {
		t.Errorf("a running orphan was cancelled %v after the crash, want within a heartbeat (%v; bound on a loaded machine %v)",
			worst, procHeartbeat, orphanCancelBound)
	}

	// Every slot back within the lease TTL once the load stopped.
	var slotsBack time.Duration
	testutil.Eventually(t, procLeaseTTL+10*time.Second, func() bool {
		ids, err := sys.liveLeases(ctx)
		if err == nil && len(ids) == 0 {
			slotsBack = time.Since(ended)
			return true
		}
		return false
	}, "every slot back")
	if slotsBack > procLeaseTTL+3*time.Second {
		t.Errorf("slots back %v after the load ended, want within the lease TTL (%v)", slotsBack, procLeaseTTL)
	}
	dead, err := sys.rdb.XLen(ctx, redisstream.DeadLetterKey(queuePrefix)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d dead letters, want none", dead)
	}
	persistent, err := sys.keysWithoutTTL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The queue's streams (one per priority) live as long as the queue.
	queueKeys := []string{redisstream.StreamKey(queuePrefix)}
	for _, p := range []protocol.Priority{protocol.PriorityHigh, protocol.PriorityLow} {
		queueKeys = append(queueKeys, redisstream.PriorityStreamKey(queuePrefix, p))
	}
	for _, k := range persistent {
		if !slices.Contains(queueKeys, k) {
			t.Errorf("key %q never expires", k)
		}
	}

	var f figures
	f.add("survivor_streams", len(streams))
	f.add("survivor_outcomes", tallyStreams(streams))
	f.add("victim_streams", len(victimStreams))
	f.add("first_done_opened_after_restart", firstDone)
	f.add("opened_after_recovery", afterRecovery)
	f.add("failed_after_recovery", failedAfterRecovery)
	f.add("orphans", orphans)
	f.add("orphans_cancelled", orphansCancelled)
	f.add("orphans_finished", orphansFinished)
	f.add("worst_cancel_after_crash", worst)
	f.add("slots_back_after_load", slotsBack)
	f.add("dead_letters", dead)
	f.add("keys_without_ttl", persistent)
	f.add("lost", lost)
	f.add("scenario", time.Since(began))
	f.log(t, "redis-restart")
}
