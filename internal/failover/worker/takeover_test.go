package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/memqueue"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestBusyWorkerTakesOrphansFirst (docs/QUEUE.md, "Takeover"), on a real
// redis-server since it rests on idle claims: a worker busy with newer
// jobs, every slot running and more jobs waiting in the queue, still takes
// a dead worker's jobs over as soon as their claims go idle (their clients
// hear the reset within the reclaim time and a round, not once a slot is
// free), and gives them the next free slots before the newer jobs.
func TestBusyWorkerTakesOrphansFirst(t *testing.T) {
	t.Parallel()
	const (
		reclaimIdle = time.Second
		concurrency = 2
		orphans     = 3
		waiting     = 4
	)
	e := newEnv(t, reclaimIdle, concurrency)
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	queue := func(name string) *redisstream.Queue {
		q, err := redisstream.New(redisstream.Config{Prefix: prefix, Consumer: name, ReclaimIdle: reclaimIdle}, srv.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	dead, live := queue("dead"), queue("live")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	enqueue := func(id string) *listener {
		job := newJob(id)
		l := e.listen(id)
		body, err := protocol.EncodeJob(job)
		if err != nil {
			t.Fatal(err)
		}
		if err := live.Enqueue(ctx, id, body); err != nil {
			t.Fatal(err)
		}
		return l
	}

	// The dead worker's jobs: fetched, never touched again.
	var orphaned []*listener
	for i := range orphans {
		orphaned = append(orphaned, enqueue(fmt.Sprint("orphan-", i)))
	}
	ds, err := dead.Fetch(ctx, orphans)
	if err != nil || len(ds) != orphans {
		t.Fatalf("the dead worker's fetch: %d, %v", len(ds), err)
	}
	died := time.Now()
	// Newer jobs: two that take every slot for 1.5 s, four that wait.
	var running, newer []*listener
	for i := range concurrency {
		running = append(running, enqueue(fmt.Sprint("running-", i)))
	}
	sim := newSim(t, llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 100 * time.Millisecond, Tokens: 15, Seed: 3})
	cfg := workerConfig()
	cfg.Concurrency = concurrency
	cfg.Heartbeat = 200 * time.Millisecond
	cfg.ReclaimIdle = reclaimIdle
	e.startWorker(cfg, live, sim)
	for _, l := range running {
		l.must(5 * time.Second) // started: every slot is busy
	}
	for i := range waiting {
		newer = append(newer, enqueue(fmt.Sprint("newer-", i)))
	}

	// Every orphan's client hears of the takeover (its reset) within the
	// reclaim time, a reclaim round and some slack, though no slot is free.
	bound := reclaimIdle + live.ReclaimInterval() + time.Second
	for i, l := range orphaned {
		var reset time.Time
		for reset.IsZero() {
			r := l.must(bound)
			if r.res.Kind == protocol.KindReset {
				reset = r.at
			}
		}
		if took := reset.Sub(died); took > bound {
			t.Errorf("orphan %d: reset %v after its worker died, want within %v", i, took, bound)
		}
	}

	// The freed slots go to the orphans before the newer jobs: each
	// orphan's first chunk comes before any newer job's.
	firstChunk := func(l *listener) time.Time {
		for {
			r := l.must(20 * time.Second)
			if r.res.Kind == protocol.KindBatch {
				return r.at
			}
		}
	}
	var lastOrphan time.Time
	for _, l := range orphaned {
		if at := firstChunk(l); at.After(lastOrphan) {
			lastOrphan = at
		}
	}
	// A newer job that took an orphan's slot would start a whole answer
	// (1.5 s) before it; first chunks of jobs started in the same
	// instant reach their listeners in either order, so a few
	// milliseconds apart is no overtaking.
	const jitter = 100 * time.Millisecond
	for i, l := range newer {
		if at := firstChunk(l); at.Before(lastOrphan.Add(-jitter)) {
			t.Errorf("newer job %d started %v before the last orphan", i, lastOrphan.Sub(at))
		}
	}
	for _, l := range append(orphaned, newer...) {
		rs := l.untilEnd(20 * time.Second)
		if last := rs[len(rs)-1]; last.res.Kind != protocol.KindDone {
			t.Errorf("ended %q, want DONE", last.raw)
		}
	}
}

// TestWorkerKeepsItsRunningAnswerWhenItReclaimsItsOwnJob: a worker whose
// own claim went idle (its heartbeat, 3 s, is slower than the queue's
// reclaim time, 2 s, and there is no fence) takes its own running job
// over in its takeover loop; the running answer goes on and is settled,
// and the copy is dropped: one answer, no reset, one DONE, settled once.
func TestWorkerKeepsItsRunningAnswerWhenItReclaimsItsOwnJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 2*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: 100 * time.Millisecond, Tokens: 60, Seed: 5})
		cfg := workerConfig()
		cfg.Heartbeat = 3 * time.Second
		job := newJob("own-1")
		l := e.listen(job.RequestID)
		e.enqueue(job)
		c := &countingReclaimer{Consumer: e.q.Consumer("a")}
		e.startWorker(cfg, c, sim)
		rs := l.untilEnd(20 * time.Second)
		if n := c.n.Load(); n == 0 {
			t.Fatal("the worker never took its own job over: the test does not test the copy")
		}
		for _, r := range rs {
			if r.res.Kind == protocol.KindReset {
				t.Fatalf("a reset: the worker answered its own job twice: %s", describe(rs))
			}
		}
		if last := rs[len(rs)-1]; last.res.Kind != protocol.KindDone {
			t.Fatalf("ended %q, want DONE", last.raw)
		}
		checkChunks(t, batches(rs), llm.SimChunks(job.Payload.Messages, 5, 60))
		synctest.Wait()
		if got := e.settled(); got[metrics.JobDone] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want done once", got)
		}
		if d := e.depth(); d != 0 {
			t.Errorf("queue depth %d, want 0", d)
		}
		l.quiet(5 * time.Second)
	})
}

// countingReclaimer counts the deliveries it handed out again (by Fetch
// or Reclaim, whichever came first).
type countingReclaimer struct {
	*memqueue.Consumer
	n atomic.Int32
}

func (c *countingReclaimer) Fetch(ctx context.Context, max int) ([]failover.Delivery, error) {
	ds, err := c.Consumer.Fetch(ctx, max)
	for _, d := range ds {
		if d.Attempt > 1 {
			c.n.Add(1)
		}
	}
	return ds, err
}

func (c *countingReclaimer) Reclaim(ctx context.Context, max int) ([]failover.Delivery, error) {
	ds, err := c.Consumer.Reclaim(ctx, max)
	c.n.Add(int32(len(ds)))
	return ds, err
}
