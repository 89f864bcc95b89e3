package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

var errInjected = errors.New("injected publish failure")

// flakyResults is a ResultPublisher that fails the publishes fail says
// to, and records every message tried.
type flakyResults struct {
	failover.ResultPublisher
	mu    sync.Mutex
	tried []protocol.Result
	fail  func(n int, r protocol.Result) bool // n counts tries from 0
}

func (f *flakyResults) ResultsFor(id string) failover.ResultSink {
	return flakySink{f: f, next: f.ResultPublisher.ResultsFor(id)}
}

type flakySink struct {
	f    *flakyResults
	next failover.ResultSink
}

func (s flakySink) Publish(ctx context.Context, msg []byte) (bool, error) {
	f := s.f
	r, err := protocol.DecodeResult(msg)
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	n := len(f.tried)
	f.tried = append(f.tried, r)
	f.mu.Unlock()
	if f.fail(n, r) {
		return false, errInjected
	}
	return s.next.Publish(ctx, msg)
}

// PublishPair tries first, then second, as one pipeline that fails as a
// whole: when first fails, second never reached Redis (it is not counted
// as tried); when second fails, first went out.
func (s flakySink) PublishPair(ctx context.Context, first, second []byte) (bool, error) {
	a, err := s.Publish(ctx, first)
	if err != nil {
		return false, err
	}
	b, err := s.Publish(ctx, second)
	return a && b, err
}

var _ failover.ResultSink = flakySink{}

func (f *flakyResults) triedKinds() map[protocol.ResultKind]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[protocol.ResultKind]int{}
	for _, r := range f.tried {
		out[r.Kind]++
	}
	return out
}

// startWith runs a worker like startWorker, publishing through results.
func (e *env) startWith(cfg worker.Config, c failover.Consumer, p llm.Provider, results failover.ResultPublisher) {
	e.tb.Helper()
	w, err := worker.New(cfg, worker.Deps{
		Consumer: c, Pool: e.pool, Provider: p, Results: results, Cancels: e.res, Metrics: e.m,
		Log: testutil.DiscardLogger(),
	})
	if err != nil {
		e.tb.Fatalf("worker.New: %v", err)
	}
	watchers := e.res.Watchers()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(ctx); err != nil {
			e.tb.Errorf("Run: %v", err)
		}
	}()
	e.tb.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(e.tb, 10*time.Second, func() bool { return e.res.Watchers() > watchers }, "worker watching cancellations")
}

// answerAfterLastReset is the content the client keeps: the chunks after
// the last reset, which must count 1, 2, 3…; and how many resets came.
func answerAfterLastReset(tb testing.TB, rs []received) (string, int) {
	tb.Helper()
	var b strings.Builder
	resets, next := 0, 1
	for _, r := range rs {
		switch r.res.Kind {
		case protocol.KindReset:
			resets++
			b.Reset()
			next = 1
		case protocol.KindBatch:
			for _, c := range r.res.Chunks {
				if c.Seq != next {
					tb.Fatalf("chunk seq %d, want %d, in %s", c.Seq, next, describe(rs))
				}
				next++
				b.WriteString(c.Content)
			}
		case protocol.KindDone:
			if r.res.Count != next-1 {
				tb.Fatalf("DONE counts %d chunks, %d arrived", r.res.Count, next-1)
			}
		}
	}
	return b.String(), resets
}

// TestWorkerRetriesFailedPublish: a batch whose publish fails once is
// retried and the answer arrives whole, without a reset.
func TestWorkerRetriesFailedPublish(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: 12, Seed: 3})
		failed := 0
		f := &flakyResults{ResultPublisher: e.res, fail: func(n int, r protocol.Result) bool {
			if r.Kind == protocol.KindBatch && r.Chunks[0].Seq == 2 && failed < 1 {
				failed++
				return true
			}
			return false
		}}
		job := newJob("retry-pub-1")
		l := e.listen(job.RequestID)
		e.startWith(workerConfig(), e.q.Consumer("w1"), sim, f)
		e.enqueue(job)
		rs := l.untilEnd(10 * time.Second)
		got, resets := answerAfterLastReset(t, rs)
		if want := strings.Join(llm.SimChunks(job.Payload.Messages, 3, 12), ""); got != want || resets != 0 {
			t.Fatalf("answer %q after %d resets, want %q after none", got, resets, want)
		}
		if end := rs[len(rs)-1].res; end.Kind != protocol.KindDone || end.Attempt != 1 {
			t.Fatalf("last message %+v, want DONE of attempt 1", end)
		}
		if failed != 1 {
			t.Fatalf("%d publishes failed, want 1", failed)
		}
	})
}

// TestWorkerRestartsAnswerAfterLostBatch: a batch not out within the
// publish budget is made good by a reset of the same attempt and the
// answer again from its first chunk; the DONE counts the chunks. When the
// lost batch is the last one, sent with its DONE (publisher.sendPair),
// DONE follows the restarted answer alone, and reaches Redis once.
func TestWorkerRestartsAnswerAfterLostBatch(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		tokens int
		// lost reports whether a batch starts the outage.
		lost func(protocol.Result) bool
	}{
		{name: "third batch", tokens: 20, lost: func(r protocol.Result) bool { return r.Chunks[0].Seq > 6 }},
		{name: "last batch, with DONE", tokens: 12, lost: func(r protocol.Result) bool { return r.Chunks[len(r.Chunks)-1].Seq == 12 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, 15*time.Second, 4)
				sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: tt.tokens, Seed: 5})
				cfg := workerConfig()
				cfg.PublishBudget = 400 * time.Millisecond
				var outageEnds time.Time
				f := &flakyResults{ResultPublisher: e.res, fail: func(n int, r protocol.Result) bool {
					// Redis refuses writes for longer than the budget from
					// that batch on.
					if outageEnds.IsZero() && r.Kind == protocol.KindBatch && tt.lost(r) {
						outageEnds = time.Now().Add(cfg.PublishBudget + 100*time.Millisecond)
					}
					return !outageEnds.IsZero() && time.Now().Before(outageEnds)
				}}
				job := newJob("restart-1")
				l := e.listen(job.RequestID)
				e.startWith(cfg, e.q.Consumer("w1"), sim, f)
				e.enqueue(job)
				rs := l.untilEnd(10 * time.Second)
				got, resets := answerAfterLastReset(t, rs)
				if want := strings.Join(llm.SimChunks(job.Payload.Messages, 5, tt.tokens), ""); got != want || resets != 1 {
					t.Fatalf("answer %q after %d resets, want %q after one (%s)", got, resets, want, describe(rs))
				}
				for _, r := range rs {
					if r.res.Kind == protocol.KindReset && (r.res.Attempt != 1 || r.res.Reset.Attempt != 1) {
						t.Errorf("reset %q, want one of attempt 1 (the same attempt restarting)", r.raw)
					}
				}
				if end := rs[len(rs)-1].res; end.Kind != protocol.KindDone || end.Count != tt.tokens {
					t.Fatalf("last message %+v, want DONE counting %d chunks", end, tt.tokens)
				}
				if n := f.triedKinds()[protocol.KindDone]; n != 1 {
					t.Errorf("DONE reached Redis %d times, want once", n)
				}
				synctest.Wait()
				if got := e.settled(); got[metrics.JobDone] != 1 {
					t.Errorf("job outcomes %v, want done", got)
				}
			})
		})
	}
}

// TestWorkerNeverSendsDoneOverLostBatch: when publishing never recovers,
// the worker gives the answer up: no DONE is even tried after the lost
// batch, and the job is settled as an error.
func TestWorkerNeverSendsDoneOverLostBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: 20, Seed: 5})
		cfg := workerConfig()
		cfg.PublishBudget = 300 * time.Millisecond
		f := &flakyResults{ResultPublisher: e.res, fail: func(n int, r protocol.Result) bool {
			return r.Kind != protocol.KindHeartbeat && (r.Kind != protocol.KindBatch || r.Chunks[0].Seq > 1)
		}}
		job := newJob("lost-1")
		l := e.listen(job.RequestID)
		e.startWith(cfg, e.q.Consumer("w1"), sim, f)
		e.enqueue(job)
		testutil.Eventually(t, time.Minute, func() bool { return e.jobs(metrics.JobError) == 1 }, "job settled as an error")
		synctest.Wait()
		if n := f.triedKinds()[protocol.KindDone]; n != 0 {
			t.Errorf("tried %d DONE after a batch was lost for good", n)
		}
		if n := f.triedKinds()[protocol.KindError]; n == 0 {
			t.Error("never tried to tell the client with an ERROR")
		}
		for _, r := range l.drain() {
			if r.res.Kind == protocol.KindDone {
				t.Errorf("client got %q", r.raw)
			}
		}
	})
}

// refreshFails is a Consumer whose claim refreshes fail (Redis
// unreachable), without telling of a takeover.
type refreshFails struct{ failover.Consumer }

func (refreshFails) Touch(context.Context, failover.Delivery) error {
	return errors.New("injected: redis unreachable")
}

// TestWorkerFenceStopsPublishing: a worker that cannot refresh its claim
// publishes nothing once the last refresh is older than ReclaimIdle minus
// one heartbeat, and leaves the job unsettled for a takeover.
func TestWorkerFenceStopsPublishing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const reclaimIdle = 3 * time.Second
		e := newEnv(t, time.Hour, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 50 * time.Millisecond, Tokens: 1000, Seed: 2})
		cfg := workerConfig()
		cfg.ReclaimIdle = reclaimIdle
		job := newJob("fence-1")
		l := e.listen(job.RequestID)
		e.startWith(cfg, &fetchOnce{Consumer: refreshFails{e.q.Consumer("a")}}, sim, e.res)
		e.enqueue(job)
		start := l.must(time.Second).at
		testutil.AdvanceFakeClock(10 * time.Second)
		synctest.Wait()
		fence := start.Add(worker.FenceAfter(reclaimIdle, cfg.Heartbeat))
		var last time.Time
		for _, r := range l.drain() {
			if r.at.After(fence) {
				t.Errorf("published %q %v after the fence", r.raw, r.at.Sub(fence))
			}
			if r.res.Kind == protocol.KindDone || r.res.Kind == protocol.KindError {
				t.Errorf("published %q for a job whose claim it could not keep", r.raw)
			}
			last = r.at
		}
		if fence.Sub(last) > 100*time.Millisecond {
			t.Errorf("last message %v before the fence: streaming should go on until it", fence.Sub(last))
		}
		if got := e.settled(); len(got) != 0 {
			t.Errorf("job outcomes %v: a fenced-off job must be left for takeover", got)
		}
		if s := e.pool.Stats(); s.InUse != 0 {
			t.Errorf("%d pool slots in use after the fence", s.InUse)
		}
	})
}

// A live worker refreshes its claim every heartbeat: the fence must leave
// it more than that, and still stop it before another may take over.
func TestFenceAfter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ reclaim, hb, want time.Duration }{
		{15 * time.Second, 5 * time.Second, 10 * time.Second},
		{3 * time.Second, 2 * time.Second, 2500 * time.Millisecond},
		{2 * time.Second, time.Second, 1500 * time.Millisecond},
	} {
		got := worker.FenceAfter(c.reclaim, c.hb)
		if got != c.want || got <= c.hb || got >= c.reclaim {
			t.Errorf("fenceAfter(%s, %s) = %s, want %s, between the heartbeat and the reclaim time", c.reclaim, c.hb, got, c.want)
		}
	}
}

// slowResults is a ResultPublisher whose batches take rtt to publish, as
// on a busy Redis: the fake clock of the test's bubble moves meanwhile.
type slowResults struct {
	failover.ResultPublisher
	rtt time.Duration
}

func (s *slowResults) ResultsFor(id string) failover.ResultSink {
	return slowSink{rtt: s.rtt, next: s.ResultPublisher.ResultsFor(id)}
}

type slowSink struct {
	rtt  time.Duration
	next failover.ResultSink
}

func (s slowSink) Publish(ctx context.Context, msg []byte) (bool, error) {
	if strings.HasPrefix(string(msg), "BATCH:") {
		time.Sleep(s.rtt) // the round trip, on the bubble's fake clock
	}
	return s.next.Publish(ctx, msg)
}

func (s slowSink) PublishPair(ctx context.Context, first, second []byte) (bool, error) {
	time.Sleep(s.rtt) // one round trip for both
	return s.next.PublishPair(ctx, first, second)
}

// TestWorkerGathersChunksWhileABatchIsOut: chunks that arrive while a
// batch is being published join the next one, so an upstream faster than
// the publishes fills fewer, larger messages; the answer arrives whole and
// in order, and the first chunk still goes alone.
func TestWorkerGathersChunksWhileABatchIsOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		// A chunk every millisecond, a publish 10 ms: ten chunks arrive
		// while one batch is out.
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond, Tokens: 60, Seed: 9})
		cfg := workerConfig()
		cfg.BatchSize = 5
		cfg.BatchTimeout = 10 * time.Second // only size and the end flush
		job := newJob("gather-1")
		l := e.listen(job.RequestID)
		e.startWith(cfg, e.q.Consumer("w1"), sim, &slowResults{ResultPublisher: e.res, rtt: 10 * time.Millisecond})
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		bs := batches(rs)
		checkChunks(t, bs, llm.SimChunks(job.Payload.Messages, 9, 60))
		sizes := batchSizes(bs)
		if sizes[0] != 1 {
			t.Errorf("batch sizes %v: the first chunk did not go alone", sizes)
		}
		// Sent one batch per 5 chunks, on the provider's goroutine, the
		// answer would take 1 + 12 messages.
		if len(bs) > 8 || slices.Max(sizes) <= cfg.BatchSize {
			t.Errorf("batch sizes %v: want fewer messages than one per %d chunks, some larger than %d", sizes, cfg.BatchSize, cfg.BatchSize)
		}
		if end := rs[len(rs)-1].res; end.Kind != protocol.KindDone || end.Count != 60 {
			t.Fatalf("last message %+v, want DONE counting 60 chunks", end)
		}
	})
}

// TestWorkerGathersAtMost64Chunks: an upstream far faster than a publish
// waits for one rather than gathering a message of any size: no batch
// holds more than 64 chunks (the batch size being smaller), and the answer
// still arrives whole.
func TestWorkerGathersAtMost64Chunks(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond, Tokens: 300, Seed: 2})
		cfg := workerConfig()
		cfg.BatchSize = 5
		cfg.BatchTimeout = 10 * time.Second
		job := newJob("gather-cap-1")
		l := e.listen(job.RequestID)
		e.startWith(cfg, e.q.Consumer("w1"), sim, &slowResults{ResultPublisher: e.res, rtt: 200 * time.Millisecond})
		e.enqueue(job)

		rs := l.untilEnd(time.Minute)
		bs := batches(rs)
		checkChunks(t, bs, llm.SimChunks(job.Payload.Messages, 2, 300))
		sizes := batchSizes(bs)
		if slices.Max(sizes) != 64 {
			t.Errorf("batch sizes %v: want the largest at the cap of 64", sizes)
		}
	})
}

// callRecorder is a ResultPublisher that records the kinds of results
// each publish call carried.
type callRecorder struct {
	failover.ResultPublisher
	tb    testing.TB
	mu    sync.Mutex
	calls [][]protocol.ResultKind
}

func (c *callRecorder) ResultsFor(id string) failover.ResultSink {
	return recordingSink{c: c, tb: c.tb, next: c.ResultPublisher.ResultsFor(id)}
}

func (c *callRecorder) record(tb testing.TB, msgs ...[]byte) {
	var kinds []protocol.ResultKind
	for _, m := range msgs {
		r, err := protocol.DecodeResult(m)
		if err != nil {
			tb.Errorf("published %q: %v", m, err)
		}
		kinds = append(kinds, r.Kind)
	}
	c.mu.Lock()
	c.calls = append(c.calls, kinds)
	c.mu.Unlock()
}

func (c *callRecorder) recorded() [][]protocol.ResultKind {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

type recordingSink struct {
	c    *callRecorder
	tb   testing.TB
	next failover.ResultSink
}

func (s recordingSink) Publish(ctx context.Context, msg []byte) (bool, error) {
	s.c.record(s.tb, msg)
	return s.next.Publish(ctx, msg)
}

func (s recordingSink) PublishPair(ctx context.Context, first, second []byte) (bool, error) {
	s.c.record(s.tb, first, second)
	return s.next.PublishPair(ctx, first, second)
}

// TestWorkerSendsDoneWithTheLastBatch: an answer's last batch and its DONE
// go out in one publish call (one pipeline on Redis), and the client gets
// them in order with the DONE counting every chunk; no DONE goes alone.
func TestWorkerSendsDoneWithTheLastBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: 12, Seed: 7})
		rec := &callRecorder{ResultPublisher: e.res, tb: t}
		job := newJob("pair-1")
		l := e.listen(job.RequestID)
		e.startWith(workerConfig(), e.q.Consumer("w1"), sim, rec)
		e.enqueue(job)
		rs := l.untilEnd(10 * time.Second)
		got, resets := answerAfterLastReset(t, rs)
		if want := strings.Join(llm.SimChunks(job.Payload.Messages, 7, 12), ""); got != want || resets != 0 {
			t.Fatalf("answer %q after %d resets, want %q after none", got, resets, want)
		}
		if end := rs[len(rs)-1].res; end.Kind != protocol.KindDone || end.Count != 12 {
			t.Fatalf("last message %+v, want DONE counting 12 chunks", end)
		}
		calls := rec.recorded()
		if last := calls[len(calls)-1]; !slices.Equal(last, []protocol.ResultKind{protocol.KindBatch, protocol.KindDone}) {
			t.Fatalf("last publish call carried %v, want a batch and DONE (calls %v)", last, calls)
		}
		for i, c := range calls[:len(calls)-1] {
			if slices.Contains(c, protocol.KindDone) {
				t.Errorf("call %d of %d carried %v: a DONE before the last call", i, len(calls), c)
			}
		}
	})
}

// endsAfterCancel is a provider that emits six chunks (the first alone,
// five in a batch), waits for more, emits a seventh, then waits for its
// call's context to end and returns success anyway: a call that finished
// just as its job was cancelled, with a chunk waiting for its batch.
type endsAfterCancel struct {
	six, more, seventh chan struct{}
}

func (p *endsAfterCancel) Name() string { return "ends-after-cancel" }

func (p *endsAfterCancel) Stream(ctx context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	for i := range 7 {
		if i == 6 {
			close(p.six)
			<-p.more
		}
		if err := emit(protocol.Chunk{Content: fmt.Sprint("c", i), Raw: fmt.Appendf(nil, `{"choices":[{"index":0,"delta":{"content":"c%d"}}]}`, i)}); err != nil {
			return llm.Result{}, err
		}
	}
	close(p.seventh)
	<-ctx.Done()
	return llm.Result{FinishReason: "stop"}, nil
}

// TestWorkerSendsNoDoneAfterACancel: a job cancelled while a chunk of its
// answer still waits to be published gets no DONE even when the provider
// call then returns success: the waiting chunk is dropped, and a DONE
// would present what went out as the whole answer.
func TestWorkerSendsNoDoneAfterACancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		p := &endsAfterCancel{six: make(chan struct{}), more: make(chan struct{}), seventh: make(chan struct{})}
		job := newJob("cancel-done-1")
		l := e.listen(job.RequestID)
		e.startWorker(workerConfig(), e.q.Consumer("w1"), p)
		e.enqueue(job)
		<-p.six
		synctest.Wait() // the first chunk and the batch of five are out
		close(p.more)
		<-p.seventh // the seventh waits for its batch's timeout
		e.cancel(job.RequestID)
		testutil.Eventually(t, time.Minute, func() bool { return len(e.settled()) > 0 }, "job settled")
		synctest.Wait()
		if got := e.settled(); got[metrics.JobCancelled] != 1 {
			t.Errorf("job outcomes %v, want cancelled", got)
		}
		chunks := 0
		for _, r := range l.drain() {
			if r.res.Kind == protocol.KindDone {
				t.Errorf("client got %q after the job was cancelled with a chunk unpublished", r.raw)
			}
			chunks += len(r.res.Chunks)
		}
		if chunks != 6 {
			t.Errorf("%d chunks published, want 6 (the seventh was still waiting when the job was cancelled)", chunks)
		}
	})
}
