package worker_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// startOrder records which job each provider call answers, in call order.
type startOrder struct {
	llm.Provider
	mu    sync.Mutex
	order []string
}

func (s *startOrder) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	s.mu.Lock()
	s.order = append(s.order, strings.TrimPrefix(req.Messages[0].Content, "tell me about "))
	s.mu.Unlock()
	return s.Provider.Stream(ctx, req, emit)
}

func (s *startOrder) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

// Jobs fetched together wait for the pool at their place in line, not in
// the order they reach it: with one slot, they start high first, FIFO
// within a priority, and a low job that waited more than two aging
// periods before them all.
func TestWorkerJobsWaitForThePoolByPriority(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 10*time.Second, 1)
		blocker, err := e.pool.TryAcquire(context.Background(), "someone")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		// Places with the default aging of 30 s: low-old −35 s, high −30 s,
		// normal −5 s, normal-2 −1 s, low +20 s.
		for _, j := range []struct {
			id     string
			prio   protocol.Priority
			waited time.Duration
		}{
			{"low", protocol.PriorityLow, 10 * time.Second},
			{"normal", protocol.PriorityNormal, 5 * time.Second},
			{"normal-2", protocol.PriorityNormal, time.Second},
			{"high", protocol.PriorityHigh, 0},
			{"low-old", protocol.PriorityLow, 65 * time.Second},
		} {
			job := newJob(j.id)
			job.UserID, job.Priority = "user-"+j.id, j.prio
			job.EnqueueTime, job.Deadline = now.Add(-j.waited), now.Add(time.Minute)
			e.listen(job.RequestID) // a client waits for every job
			e.enqueue(job)
		}
		rec := &startOrder{Provider: newSim(t, llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: 3, Seed: 1})}
		cfg := workerConfig()
		cfg.Concurrency = 8
		e.startWorker(cfg, e.q.Consumer("w1"), rec)
		synctest.Wait()
		if n := e.pool.Waiting(); n != 5 {
			t.Fatalf("%d jobs waiting for the pool, want all 5 (settled %v, depth %d)", n, e.settled(), e.depth())
		}
		blocker.Release()
		// Five answers of 40 ms one after another, on the bubble's clock.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := e.jobs("done"); n != 5 {
			t.Fatalf("%d jobs done, want 5", n)
		}
		if got, want := rec.got(), []string{"low-old", "high", "normal", "normal-2", "low"}; !slices.Equal(got, want) {
			t.Fatalf("start order %v, want %v", got, want)
		}
	})
}
