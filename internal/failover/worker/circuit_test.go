package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// circuitThenOK refuses its first calls as an open circuit does, then
// answers from the simulator.
type circuitThenOK struct {
	llm.Provider
	mu     sync.Mutex
	refuse int
	calls  []time.Time
}

func (c *circuitThenOK) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	c.mu.Lock()
	c.calls = append(c.calls, time.Now())
	refuse := len(c.calls) <= c.refuse
	c.mu.Unlock()
	if refuse {
		return llm.Result{}, &llm.Error{Retryable: true, RetryAfter: 3 * time.Second,
			Err: fmt.Errorf("fake: %w", llm.ErrCircuitOpen)}
	}
	return c.Provider.Stream(ctx, req, emit)
}

// While the provider's circuit is open the worker waits for it (as long as
// the advised delay says) without spending its retries, then answers.
func TestWorkerWaitsOutOpenCircuitWithoutRetries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		p := &circuitThenOK{Provider: newSim(t, llm.SimConfig{Tokens: 6, Seed: 2}), refuse: 3}
		cfg := workerConfig()
		cfg.MaxRetries = 0 // any retry spent would dead-letter the job
		job := newJob("circuit-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), p)
		e.enqueue(job)

		rs := l.untilEnd(time.Minute)
		body := withoutHeartbeats(rs)
		if last := body[len(body)-1].res.Kind; last != protocol.KindDone {
			t.Fatalf("messages %s: want DONE last", describe(rs))
		}
		checkChunks(t, batches(rs), llm.SimChunks(job.Payload.Messages, 2, 6))
		if n := e.retries(); n != 0 {
			t.Errorf("WorkerRetries %d, want 0: circuit waits spend no retries", n)
		}
		if n := e.retriesFor("circuit_open"); n != 3 {
			t.Errorf("WorkerRetries{reason=circuit_open} %d, want 3 waits", n)
		}
		var waits []protocol.Retrying
		for _, r := range body {
			if r.res.Kind == protocol.KindRetrying {
				waits = append(waits, *r.res.Retrying)
			}
		}
		for i, r := range waits {
			if want := (protocol.Retrying{Attempt: i + 2, RetryInSeconds: 3, Reason: "circuit_open"}); r != want {
				t.Errorf("retrying %d = %+v, want %+v", i, r, want)
			}
		}
		if len(waits) != 3 {
			t.Errorf("messages %s: %d RETRYING, want 3", describe(rs), len(waits))
		}
		p.mu.Lock()
		calls := p.calls
		p.mu.Unlock()
		if len(calls) != 4 {
			t.Fatalf("provider called %d times, want 4", len(calls))
		}
		if gap := calls[1].Sub(calls[0]); gap != 3*time.Second {
			t.Errorf("waited %v after an open circuit, want its advised 3s", gap)
		}
		synctest.Wait()
		if got := e.settled(); got[metrics.JobDone] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want done once", got)
		}
	})
}

// A circuit that stays open longer than a client waits for a queued job
// ends the job with provider-unavailable instead of holding it forever.
func TestWorkerGivesUpOnCircuitThatStaysOpen(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		p := &circuitThenOK{Provider: newSim(t, llm.SimConfig{Tokens: 6, Seed: 2}), refuse: 1000}
		cfg := workerConfig()
		cfg.QueueTimeout = 10 * time.Second
		job := newJob("circuit-2")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), p)
		e.enqueue(job)

		rs := l.untilEnd(time.Minute)
		last := withoutHeartbeats(rs)
		end := last[len(last)-1].res
		if end.Kind != protocol.KindError || end.Problem.Slug() != protocol.ProblemProviderUnavailable {
			t.Fatalf("messages %s: want an ERROR provider-unavailable last", describe(rs))
		}
		if n := e.retries(); n != 0 {
			t.Errorf("WorkerRetries %d, want 0", n)
		}
		synctest.Wait()
		if got := e.settled(); got[metrics.JobError] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want error once", got)
		}
	})
}
