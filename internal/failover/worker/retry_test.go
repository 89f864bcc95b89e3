package worker_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// retryings returns the RETRYING payloads of rs, in order. Every one must
// be fenced with the delivery's attempt (1 here: no takeover), like the
// other messages, so the api can drop one of a worker that lost the job.
func retryings(tb testing.TB, rs []received) []protocol.Retrying {
	tb.Helper()
	var out []protocol.Retrying
	for _, r := range rs {
		if r.res.Kind == protocol.KindRetrying {
			if r.res.Attempt != 1 {
				tb.Errorf("SIGNAL:RETRYING fenced with attempt %d, want the delivery's 1", r.res.Attempt)
			}
			out = append(out, *r.res.Retrying)
		}
	}
	return out
}

// gaps returns the time between consecutive calls.
func gaps(calls []time.Time) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(calls); i++ {
		out = append(out, calls[i].Sub(calls[i-1]))
	}
	return out
}

// An upstream 429 with Retry-After is retried after it, not before, and the
// client is told how long it waits; RetryAfterMax caps a longer one.
func TestWorkerHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		retryAfter    time.Duration
		retryAfterMax time.Duration
		wantWait      time.Duration
	}{
		{"honoured", 3 * time.Second, 30 * time.Second, 3 * time.Second},
		{"capped at LLM_RETRY_AFTER_MAX_SECONDS", 20 * time.Second, 5 * time.Second, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, 15*time.Second, 4)
				rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 4, Seed: 3, FailFirst: 2,
					FailStatus: http.StatusTooManyRequests, FailRetryAfter: tt.retryAfter})}
				cfg := workerConfig()
				cfg.Retry.RetryAfterMax = tt.retryAfterMax
				job := newJob("throttled-1")
				l := e.listen(job.RequestID)
				e.startWorker(cfg, e.q.Consumer("w1"), rec)
				e.enqueue(job)

				rs := l.untilEnd(time.Minute)
				if last := rs[len(rs)-1].res.Kind; last != protocol.KindDone {
					t.Fatalf("messages %s: want DONE last", describe(rs))
				}
				checkChunks(t, batches(rs), llm.SimChunks(job.Payload.Messages, 3, 4))
				if got := gaps(rec.callTimes()); !slices.Equal(got, []time.Duration{tt.wantWait, tt.wantWait}) {
					t.Errorf("waits between calls %v, want %v twice (the fake clock is exact)", got, tt.wantWait)
				}
				want := []protocol.Retrying{
					{Attempt: 2, RetryInSeconds: tt.wantWait.Seconds(), Reason: llm.ReasonThrottled},
					{Attempt: 3, RetryInSeconds: tt.wantWait.Seconds(), Reason: llm.ReasonThrottled},
				}
				if got := retryings(t, rs); !slices.Equal(got, want) {
					t.Errorf("retrying events %+v, want %+v", got, want)
				}
				if n := e.retriesFor(llm.ReasonThrottled); n != 2 {
					t.Errorf("WorkerRetries{reason=throttled} %d, want 2", n)
				}
			})
		})
	}
}

// A 503 without Retry-After waits 2 s, then 4 s: seconds, not the
// sub-second backoff of a transient fault.
func TestWorkerThrottledBackoffWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 4, Seed: 3, FailFirst: 2, FailStatus: http.StatusServiceUnavailable})}
		job := newJob("throttled-2")
		l := e.listen(job.RequestID)
		e.startWorker(workerConfig(), e.q.Consumer("w1"), rec)
		e.enqueue(job)

		if rs := l.untilEnd(time.Minute); rs[len(rs)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s: want DONE last", describe(rs))
		}
		if got, want := gaps(rec.callTimes()), []time.Duration{2 * time.Second, 4 * time.Second}; !slices.Equal(got, want) {
			t.Errorf("waits between calls %v, want %v", got, want)
		}
	})
}

// rejecting answers every call with an upstream client error.
type rejecting struct {
	status int
	calls  atomic.Int32
}

func (r *rejecting) Name() string { return "rejecting" }

func (r *rejecting) Stream(context.Context, protocol.ChatRequest, func(protocol.Chunk) error) (llm.Result, error) {
	r.calls.Add(1)
	return llm.Result{}, &llm.Error{Status: r.status, Err: errors.New("fake: model not found")}
}

// An upstream refusal of the request itself goes to the client at once as
// provider-rejected: no retry, no dead letter.
func TestWorkerClientErrorIsNotRetriedNorDeadLettered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		p := &rejecting{status: http.StatusNotFound}
		job := newJob("rejected-1")
		l := e.listen(job.RequestID)
		e.startWorker(workerConfig(), e.q.Consumer("w1"), p)
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		body := withoutHeartbeats(rs)
		if len(body) != 1 || body[0].res.Kind != protocol.KindError {
			t.Fatalf("messages %s, want exactly one SIGNAL:ERROR", describe(rs))
		}
		// The upstream's status reaches the client (docs/API.md,
		// "Upstream client errors are the client's").
		if prob := body[0].res.Problem; prob.Slug() != protocol.ProblemProviderRejected || prob.Status != http.StatusNotFound ||
			prob.RetryAfterSeconds != 0 {
			t.Errorf("problem %+v, want provider-rejected, 404, no retry advised", prob)
		}
		l.quiet(5 * time.Second)
		synctest.Wait()
		if n := p.calls.Load(); n != 1 {
			t.Errorf("provider called %d times, want 1", n)
		}
		if n := len(e.deadLetters()); n != 0 {
			t.Errorf("%d dead letters, want none", n)
		}
		if got := e.settled(); got[metrics.JobError] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want error once", got)
		}
	})
}

// The retry waits of one job are bounded by QueueTimeout: a Retry-After
// that would pass it ends the job now rather than keep the client waiting.
func TestWorkerRetryWaitsBoundedByQueueTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 4, Seed: 3, FailFirst: 5,
			FailStatus: http.StatusTooManyRequests, FailRetryAfter: 8 * time.Second})}
		cfg := workerConfig()
		cfg.QueueTimeout = 10 * time.Second
		job := newJob("budget-1")
		l := e.listen(job.RequestID)
		start := time.Now()
		e.startWorker(cfg, e.q.Consumer("w1"), rec)
		e.enqueue(job)

		rs := l.untilEnd(time.Minute)
		end := rs[len(rs)-1]
		if end.res.Kind != protocol.KindError || end.res.Problem.Slug() != protocol.ProblemProviderError || end.res.Problem.RetryAfterSeconds != 8 {
			t.Fatalf("messages %s: want ERROR provider-error advising 8 s last", describe(rs))
		}
		if waited := end.at.Sub(start); waited < 8*time.Second || waited > 9*time.Second {
			t.Errorf("job ended after %v, want 8s and a little: one wait, the second would pass the 10s queue timeout", waited)
		}
		if n := len(rec.callTimes()); n != 2 {
			t.Errorf("provider called %d times, want 2", n)
		}
		synctest.Wait()
		if got := e.settled(); got[metrics.JobDeadLetter] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want dead_letter once", got)
		}
	})
}

// A job's request is told once, when the worker gave its client the
// end: nil for an answer served after failed calls, the last error for
// one dead-lettered after every retry (the degradation level counts
// requests, not calls).
func TestWorkerTellsHowEachRequestEnded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		var mu sync.Mutex
		var ends []error
		e.ended = func(err error) {
			mu.Lock()
			ends = append(ends, err)
			mu.Unlock()
		}
		cfg := workerConfig()
		cfg.MaxRetries = 2
		served := newJob("served-after-two-failures")
		ls := e.listen(served.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), newSim(t, llm.SimConfig{Tokens: 4, Seed: 3, FailFirst: 2, FailStatus: http.StatusBadGateway}))
		e.enqueue(served)
		if rs := ls.untilEnd(time.Minute); rs[len(rs)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s: want DONE last", describe(rs))
		}
		synctest.Wait()
		mu.Lock()
		if len(ends) != 1 || ends[0] != nil {
			t.Errorf("ends after a request served on its third call: %v, want one nil", ends)
		}
		ends = nil
		mu.Unlock()

		e2 := newEnv(t, 15*time.Second, 4)
		e2.ended = e.ended
		failed := newJob("failing-always")
		lf := e2.listen(failed.RequestID)
		e2.startWorker(cfg, e2.q.Consumer("w2"), newSim(t, llm.SimConfig{Tokens: 4, Seed: 3, FailRate: 1, FailStatus: http.StatusBadGateway}))
		e2.enqueue(failed)
		if rs := lf.untilEnd(time.Minute); rs[len(rs)-1].res.Kind != protocol.KindError {
			t.Fatalf("messages %s: want ERROR last", describe(rs))
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		var le *llm.Error
		if len(ends) != 1 || !errors.As(ends[0], &le) || le.Status != http.StatusBadGateway {
			t.Errorf("ends after a request failing every call: %v, want one 502", ends)
		}
	})
}
