package worker_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// A StopGrace of 0 (SHUTDOWN_GRACE_SECONDS=0) gives running jobs no time:
// Run returns at once and the job is left for takeover, as the api's
// drain of 0 ends its streams at once; it is not read as "the default".
func TestWorkerStopGraceZeroLeavesJobsAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 2*time.Second, 4)
		// 1000 chunks 100ms apart: far longer than any grace.
		sim := newSim(t, llm.SimConfig{TokenInterval: 100 * time.Millisecond, Tokens: 1000, Seed: 1})
		cfg := workerConfig()
		cfg.StopGrace = 0
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Validate with StopGrace 0: %v", err)
		}
		w := e.startWorker(cfg, e.q.Consumer("w1"), sim)
		job := newJob("grace-0")
		l := e.listen(job.RequestID)
		e.enqueue(job)
		l.must(time.Second)

		stopAt := time.Now()
		w.stop()
		if took := time.Since(stopAt); took != 0 {
			t.Errorf("Run returned %v after the stop, want at once (no grace)", took)
		}
		synctest.Wait()
		if got := e.settled(); len(got) != 0 {
			t.Errorf("job outcomes %v: a job cut off by the stop must not be settled", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ds, err := e.q.Consumer("w2").Fetch(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("takeover Fetch: %+v, %v", ds, err)
		}
		if got, _ := protocol.DecodeJob(ds[0].Body); got.RequestID != job.RequestID || ds[0].Attempt != 2 {
			t.Errorf("took over %s attempt %d, want %s attempt 2", got.RequestID, ds[0].Attempt, job.RequestID)
		}
	})
}
