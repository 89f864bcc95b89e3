package worker_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/memqueue"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/memresults"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Most tests here run inside a testing/synctest bubble on plain in-memory
// fakes: memresults.Memory carries results and cancellations, memqueue the
// jobs, and the pool and the simulator wait only on channels and timers,
// so durations are exact on the bubble's fake clock and a loaded machine
// cannot make them flaky.

// env is one test's result channel, queue, pool and metrics.
type env struct {
	tb   testing.TB
	res  *memresults.Memory
	q    *memqueue.Queue
	pool *pool.Local
	m    *metrics.Metrics
	// ended, when set before startWorker, is the workers' Deps.Ended.
	ended func(error)
}

// newEnv returns an env; inside a synctest bubble, create it there.
func newEnv(tb testing.TB, reclaimIdle time.Duration, poolSize int) *env {
	tb.Helper()
	// The listener of a test reads every message, so its buffer only has
	// to hold what arrives between two reads.
	res, err := memresults.New(memresults.Config{Buffer: 10000})
	if err != nil {
		tb.Fatalf("results.NewMemory: %v", err)
	}
	q, err := memqueue.New(memqueue.Config{ReclaimIdle: reclaimIdle})
	if err != nil {
		tb.Fatalf("memqueue.New: %v", err)
	}
	p, err := pool.NewLocal(poolSize, poolSize)
	if err != nil {
		tb.Fatalf("pool.NewLocal: %v", err)
	}
	return &env{tb: tb, res: res, q: q, pool: p, m: metrics.New(prometheus.NewRegistry())}
}

func workerConfig() worker.Config {
	return worker.Config{
		Concurrency:  4,
		Heartbeat:    time.Second,
		BatchSize:    5,
		BatchTimeout: 100 * time.Millisecond,
		MaxRetries:   5,
		Retry:        llm.RetryPolicy{BaseDelay: 100 * time.Millisecond, MaxDelay: 5 * time.Second},
		QueueTimeout: 30 * time.Second,
		StopGrace:    5 * time.Second,
	}
}

// runningWorker is a Worker whose Run goroutine the test owns.
type runningWorker struct {
	*worker.Worker
	cancel context.CancelFunc
	done   chan struct{}
}

// stop cancels Run's context and waits for Run to return.
func (rw *runningWorker) stop() {
	rw.cancel()
	<-rw.done
}

// startWorker runs a worker on c until the test ends, and returns once it
// watches for cancellations.
func (e *env) startWorker(cfg worker.Config, c failover.Consumer, p llm.Provider) *runningWorker {
	e.tb.Helper()
	return e.runWorker(cfg, worker.Deps{
		Consumer: c, Pool: e.pool, Provider: p, Results: e.res, Cancels: e.res, Metrics: e.m,
		Log: testutil.DiscardLogger(), Ended: e.ended,
	})
}

// runWorker runs a worker with deps until the test ends, and returns once
// it watches for cancellations (deps.Cancels must pass its watch on to
// e.res, as the tests' wrappers of it do).
func (e *env) runWorker(cfg worker.Config, deps worker.Deps) *runningWorker {
	e.tb.Helper()
	w, err := worker.New(cfg, deps)
	if err != nil {
		e.tb.Fatalf("worker.New: %v", err)
	}
	watchers := e.res.Watchers()
	ctx, cancel := context.WithCancel(context.Background())
	rw := &runningWorker{Worker: w, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rw.done)
		if err := w.Run(ctx); err != nil {
			e.tb.Errorf("Run: %v", err)
		}
	}()
	e.tb.Cleanup(rw.stop)
	testutil.Eventually(e.tb, 10*time.Second, func() bool { return e.res.Watchers() > watchers }, "worker watching cancellations")
	return rw
}

// cancel tells the workers requestID's client left, as the api does.
func (e *env) cancel(requestID string) {
	e.tb.Helper()
	if err := e.res.Cancel(context.Background(), requestID, time.Hour); err != nil {
		e.tb.Fatalf("Cancel: %v", err)
	}
}

func newJob(id string) protocol.Job {
	now := time.Now()
	return protocol.Job{
		RequestID:   id,
		UserID:      "user-1",
		Payload:     protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "tell me about " + id}}},
		EnqueueTime: now,
		Deadline:    now.Add(30 * time.Second),
	}
}

func (e *env) enqueue(job protocol.Job) {
	e.tb.Helper()
	body, err := protocol.EncodeJob(job)
	if err != nil {
		e.tb.Fatalf("EncodeJob: %v", err)
	}
	if err := e.q.Enqueue(context.Background(), job.RequestID, body); err != nil {
		e.tb.Fatalf("Enqueue: %v", err)
	}
}

func (e *env) depth() int64 {
	e.tb.Helper()
	n, err := e.q.Depth(context.Background())
	if err != nil {
		e.tb.Fatalf("Depth: %v", err)
	}
	return n
}

func (e *env) deadLetters() []failover.DeadLetter {
	e.tb.Helper()
	dls, err := e.q.DeadLetters(context.Background(), 100)
	if err != nil {
		e.tb.Fatalf("DeadLetters: %v", err)
	}
	return dls
}

func (e *env) jobs(outcome string) int {
	return int(promtest.ToFloat64(e.m.WorkerJobs.WithLabelValues(outcome)))
}

// settled returns the worker's job outcomes with a non-zero count.
func (e *env) settled() map[string]int {
	out := map[string]int{}
	for _, o := range []string{metrics.JobDone, metrics.JobError, metrics.JobExpired, metrics.JobCancelled, metrics.JobDeadLetter} {
		if n := e.jobs(o); n > 0 {
			out[o] = n
		}
	}
	return out
}

// retries is the provider retries counted, circuit waits not included.
func (e *env) retries() int {
	n := 0
	for _, r := range metrics.RetryReasons {
		if r != "circuit_open" {
			n += e.retriesFor(r)
		}
	}
	return n + e.retriesFor(llm.ReasonOther) + e.retriesFor(llm.ReasonBadResponse)
}

// retriesFor is spillway_worker_retries_total{reason}.
func (e *env) retriesFor(reason string) int {
	return int(promtest.ToFloat64(e.m.WorkerRetries.WithLabelValues(reason)))
}

func newSim(tb testing.TB, cfg llm.SimConfig) *llm.Sim {
	tb.Helper()
	s, err := llm.NewSim(cfg)
	if err != nil {
		tb.Fatalf("NewSim: %v", err)
	}
	return s
}

// recorder wraps a provider, records when each call started and how many
// chunks it emitted, and can make the first call fail after some chunks.
type recorder struct {
	llm.Provider
	// failFirstAfter > 0 makes the first call fail with a retryable error
	// after emitting that many chunks.
	failFirstAfter int

	mu      sync.Mutex
	calls   []time.Time
	emitted int
}

func (r *recorder) Stream(ctx context.Context, req protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	r.mu.Lock()
	call := len(r.calls)
	r.calls = append(r.calls, time.Now())
	r.mu.Unlock()
	n := 0
	return r.Provider.Stream(ctx, req, func(chunk protocol.Chunk) error {
		content := chunk.Content
		if call == 0 && r.failFirstAfter > 0 && n == r.failFirstAfter {
			return &llm.Error{Retryable: true, Status: 502, Err: errors.New("fake: upstream reset mid-answer")}
		}
		n++
		r.mu.Lock()
		r.emitted++
		r.mu.Unlock()
		return emit(protocol.Chunk{Content: content})
	})
}

func (r *recorder) callTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func (r *recorder) chunks() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.emitted
}

// fetchOnce lets its worker fetch one batch of deliveries; later fetches
// wait for the context to end.
type fetchOnce struct {
	failover.Consumer
	used atomic.Bool
}

func (f *fetchOnce) Fetch(ctx context.Context, max int) ([]failover.Delivery, error) {
	if f.used.Swap(true) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.Consumer.Fetch(ctx, max)
}

// received is one result-channel message and when it arrived.
type received struct {
	raw string
	res protocol.Result
	at  time.Time
}

// listener collects what is published on one result channel, as the api
// would see it.
type listener struct {
	tb testing.TB
	c  chan received
}

// listen subscribes to id's result channel, as the api would.
func (e *env) listen(id string) *listener {
	e.tb.Helper()
	sub, err := e.res.SubscribeResults(context.Background(), id)
	if err != nil {
		e.tb.Fatalf("SubscribeResults %s: %v", id, err)
	}
	l := &listener{tb: e.tb, c: make(chan received, 10000)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range sub.C() {
			r := received{raw: string(msg), at: time.Now()}
			res, err := protocol.DecodeResult(msg)
			if err != nil {
				e.tb.Errorf("worker published a malformed message %q: %v", msg, err)
				continue
			}
			r.res = res
			l.c <- r
		}
	}()
	e.tb.Cleanup(func() {
		sub.Close()
		<-done
	})
	return l
}

// next returns the next message, or false when none arrives within d.
func (l *listener) next(d time.Duration) (received, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-l.c:
		return r, true
	case <-t.C:
		return received{}, false
	}
}

// drain returns the messages that arrived so far; call synctest.Wait
// first so that none is still on its way.
func (l *listener) drain() []received {
	var out []received
	for {
		select {
		case r := <-l.c:
			out = append(out, r)
		default:
			return out
		}
	}
}

// must returns the next message, failing the test when none arrives
// within d.
func (l *listener) must(d time.Duration) received {
	l.tb.Helper()
	r, ok := l.next(d)
	if !ok {
		l.tb.Fatalf("no message within %v", d)
	}
	return r
}

// untilEnd returns every message up to and including DONE or ERROR.
func (l *listener) untilEnd(d time.Duration) []received {
	l.tb.Helper()
	var out []received
	for {
		r, ok := l.next(d)
		if !ok {
			l.tb.Fatalf("no DONE or ERROR: nothing within %v after %d messages %s", d, len(out), describe(out))
		}
		out = append(out, r)
		if r.res.Kind == protocol.KindDone || r.res.Kind == protocol.KindError {
			return out
		}
	}
}

// quiet fails the test if a message arrives within d.
func (l *listener) quiet(d time.Duration) {
	l.tb.Helper()
	if r, ok := l.next(d); ok {
		l.tb.Fatalf("unexpected message %q", r.raw)
	}
}

func describe(rs []received) string {
	var b strings.Builder
	b.WriteString("[")
	for i, r := range rs {
		if i > 0 {
			b.WriteString(" ")
		}
		raw := r.raw
		if len(raw) > 60 {
			raw = raw[:60] + "…"
		}
		b.WriteString(raw)
	}
	b.WriteString("]")
	return b.String()
}

func kinds(rs []received) []protocol.ResultKind {
	out := make([]protocol.ResultKind, len(rs))
	for i, r := range rs {
		out[i] = r.res.Kind
	}
	return out
}

func withoutHeartbeats(rs []received) []received {
	return slices.DeleteFunc(slices.Clone(rs), func(r received) bool { return r.res.Kind == protocol.KindHeartbeat })
}

// batches returns the BATCH messages of rs.
func batches(rs []received) [][]protocol.Chunk {
	var out [][]protocol.Chunk
	for _, r := range rs {
		if r.res.Kind == protocol.KindBatch {
			out = append(out, r.res.Chunks)
		}
	}
	return out
}

// checkChunks fails unless the batches carry want, in order, with
// sequence numbers 1..len(want).
func checkChunks(tb testing.TB, bs [][]protocol.Chunk, want []string) {
	tb.Helper()
	var got []string
	seq := 0
	for _, b := range bs {
		for _, c := range b {
			seq++
			if c.Seq != seq {
				tb.Fatalf("chunk %q has seq %d, want %d (batches %v)", c.Content, c.Seq, seq, bs)
			}
			got = append(got, c.Content)
		}
	}
	if !slices.Equal(got, want) {
		tb.Fatalf("published chunks\n%q\nwant\n%q", got, want)
	}
}

func batchSizes(bs [][]protocol.Chunk) []int {
	out := make([]int, len(bs))
	for i, b := range bs {
		out[i] = len(b)
	}
	return out
}

func TestWorkerBatchesBySize(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond, Tokens: 12, Seed: 7})
		cfg := workerConfig()
		cfg.BatchSize = 5
		cfg.BatchTimeout = 10 * time.Second // only size and the end flush
		job := newJob("size-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), sim)
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		want := []protocol.ResultKind{protocol.KindHeartbeat, protocol.KindBatch, protocol.KindBatch, protocol.KindBatch, protocol.KindBatch, protocol.KindDone}
		if !slices.Equal(kinds(rs), want) {
			t.Fatalf("messages %s, want kinds %v", describe(rs), want)
		}
		bs := batches(rs)
		// The first chunk alone, at once; then batches of 5; the rest at the end.
		if got := batchSizes(bs); !slices.Equal(got, []int{1, 5, 5, 1}) {
			t.Errorf("batch sizes %v, want [1 5 5 1]", got)
		}
		checkChunks(t, bs, llm.SimChunks(job.Payload.Messages, 7, 12))
		done := rs[len(rs)-1].res.Done
		if done == nil || done.Usage == nil || done.Usage.CompletionTokens != 12 || done.RequestID != job.RequestID ||
			done.FinishReason != "stop" || done.Path != protocol.PathQueued {
			t.Errorf("DONE payload %q lacks the request id, finish reason, path or usage of 12 tokens", rs[len(rs)-1].raw)
		}
		synctest.Wait()
		if got := e.settled(); got[metrics.JobDone] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want done once", got)
		}
		if d := e.depth(); d != 0 {
			t.Errorf("queue depth %d after DONE, want 0 (acknowledged)", d)
		}
	})
}

func TestWorkerBatchesByTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		// Chunks every 20ms, batches flushed 30ms after their first chunk:
		// each batch holds the chunks at +0ms and +20ms.
		sim := newSim(t, llm.SimConfig{FirstToken: 20 * time.Millisecond, TokenInterval: 20 * time.Millisecond, Tokens: 10, Seed: 3})
		cfg := workerConfig()
		cfg.BatchSize = 100
		cfg.BatchTimeout = 30 * time.Millisecond
		job := newJob("timeout-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), sim)
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		if rs[len(rs)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s, want DONE last", describe(rs))
		}
		bs := batches(rs)
		if len(bs) < 4 {
			t.Errorf("batch sizes %v: want the 10 chunks flushed by the timeout in several batches", batchSizes(bs))
		}
		for _, b := range bs {
			if len(b) > 2 {
				t.Errorf("batch sizes %v: a batch holds more than the 2 chunks that arrive within the timeout", batchSizes(bs))
				break
			}
		}
		checkChunks(t, bs, llm.SimChunks(job.Payload.Messages, 3, 10))
	})
}

func TestWorkerHeartbeatsWhileWaitingAndRunning(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const reclaimIdle = 3 * time.Second
		e := newEnv(t, reclaimIdle, 1)
		held, err := e.pool.TryAcquire(context.Background(), "someone-else")
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		sim := newSim(t, llm.SimConfig{FirstToken: 2200 * time.Millisecond, Tokens: 3, Seed: 1})
		cfg := workerConfig()
		cfg.Heartbeat = time.Second
		job := newJob("hb-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), sim)
		start := time.Now()
		e.enqueue(job)

		first := l.must(time.Second)
		if first.res.Kind != protocol.KindHeartbeat || first.at.Sub(start) != 0 {
			t.Fatalf("first message %q after %v, want SIGNAL:HEARTBEAT at once (before the slot wait)", first.raw, first.at.Sub(start))
		}
		// While the job waits for the slot, another consumer must not take
		// it over: the heartbeat keeps the claim fresh past ReclaimIdle.
		stolen := make(chan []failover.Delivery, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 4500*time.Millisecond)
			defer cancel()
			ds, _ := e.q.Consumer("w2").Fetch(ctx, 1)
			stolen <- ds
		}()
		for i := 1; i <= 4; i++ {
			r := l.must(2 * time.Second)
			if r.res.Kind != protocol.KindHeartbeat || r.at.Sub(start) != time.Duration(i)*time.Second {
				t.Fatalf("waiting message %d: %q after %v, want a heartbeat after %ds", i, r.raw, r.at.Sub(start), i)
			}
		}
		if ds := <-stolen; len(ds) != 0 {
			t.Fatalf("another consumer took the job over while its worker waited for a slot: %+v", ds)
		}
		// At 4.5s the slot frees; the answer's first chunk comes 2.2s later.
		testutil.AdvanceFakeClock(4500*time.Millisecond - time.Since(start))
		held.Release()
		rs := l.untilEnd(10 * time.Second)
		beats := 0
		for _, r := range rs {
			if r.res.Kind == protocol.KindBatch {
				break
			}
			if r.res.Kind != protocol.KindHeartbeat {
				t.Fatalf("messages %s: %q before the first batch", describe(rs), r.raw)
			}
			beats++
		}
		if beats < 2 {
			t.Errorf("messages %s: %d heartbeats while the provider ran 2.2s, want at least 2", describe(rs), beats)
		}
		checkChunks(t, batches(rs), llm.SimChunks(job.Payload.Messages, 1, 3))
	})
}

func TestWorkerRetriesWithBackoff(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		// 502: a server error, which backs off from BaseDelay (a 503 is
		// throttling, TestWorkerHonoursRetryAfter).
		rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 8, Seed: 5, FailFirst: 2, FailStatus: 502})}
		cfg := workerConfig()
		cfg.Retry.BaseDelay = 100 * time.Millisecond
		job := newJob("retry-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), rec)
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		body := withoutHeartbeats(rs)
		var retrying []*protocol.Retrying
		for _, r := range body[:len(body)-1] {
			switch r.res.Kind {
			case protocol.KindBatch:
				if len(retrying) != 2 {
					t.Fatalf("messages %s: a batch before both RETRYING", describe(rs))
				}
			case protocol.KindRetrying:
				retrying = append(retrying, r.res.Retrying)
			default:
				t.Fatalf("messages %s: want only RETRYING, batches and DONE, no RESET or ERROR", describe(rs))
			}
		}
		for i, r := range retrying {
			if r.Attempt != i+2 || r.Reason != llm.ReasonServerError || r.RetryInSeconds < 0.05*float64(i+1) || r.RetryInSeconds > 0.15*float64(i+1) {
				t.Errorf("retrying %d = %+v, want attempt %d, reason server_error, about %vs", i, r, i+2, 0.1*float64(i+1))
			}
		}
		if body[len(body)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s: want DONE last", describe(rs))
		}
		checkChunks(t, batches(rs), llm.SimChunks(job.Payload.Messages, 5, 8))
		if n := e.retriesFor(llm.ReasonServerError); n != 2 {
			t.Errorf("WorkerRetries{reason=server_error} %d, want 2", n)
		}
		calls := rec.callTimes()
		if len(calls) != 3 {
			t.Fatalf("provider called %d times, want 3", len(calls))
		}
		// Exponential backoff with ±50% jitter: about 100ms, then 200ms.
		gaps := []time.Duration{calls[1].Sub(calls[0]), calls[2].Sub(calls[1])}
		if gaps[0] < 50*time.Millisecond || gaps[0] > 150*time.Millisecond ||
			gaps[1] < 100*time.Millisecond || gaps[1] > 300*time.Millisecond {
			t.Errorf("backoff delays %v, want one in [50ms,150ms] then one in [100ms,300ms]", gaps)
		}
		synctest.Wait()
		if got := e.settled(); got[metrics.JobDone] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want done once", got)
		}
	})
}

func TestWorkerBackoffStaysWithinMaxDelay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 2, Seed: 5, FailFirst: 10, FailStatus: 500})}
		cfg := workerConfig()
		cfg.MaxRetries = 10
		cfg.Retry.BaseDelay = 100 * time.Millisecond
		cfg.Retry.MaxDelay = 200 * time.Millisecond
		job := newJob("cap-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), rec)
		e.enqueue(job)

		if rs := l.untilEnd(30 * time.Second); rs[len(rs)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s, want DONE", describe(rs))
		}
		calls := rec.callTimes()
		if len(calls) != 11 {
			t.Fatalf("provider called %d times, want 11", len(calls))
		}
		for i := 1; i < len(calls); i++ {
			if gap := calls[i].Sub(calls[i-1]); gap > cfg.Retry.MaxDelay || gap < cfg.Retry.BaseDelay/2 {
				t.Errorf("delay before retry %d is %v, want within [%v, MaxDelay %v]", i, gap, cfg.Retry.BaseDelay/2, cfg.Retry.MaxDelay)
			}
		}
	})
}

func TestWorkerDeadLettersAfterMaxRetries(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 8, Seed: 1, FailRate: 1, FailStatus: 502})}
		cfg := workerConfig()
		cfg.MaxRetries = 2
		job := newJob("dead-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), rec)
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		body := withoutHeartbeats(rs)
		if k := kinds(body); !slices.Equal(k, []protocol.ResultKind{protocol.KindRetrying, protocol.KindRetrying, protocol.KindError}) {
			t.Fatalf("messages %s, want two SIGNAL:RETRYING, one SIGNAL:ERROR and nothing else but heartbeats", describe(rs))
		}
		p := body[2].res.Problem
		if p.Slug() != protocol.ProblemProviderError || p.Status != 502 || p.RetryAfterSeconds < 1 {
			t.Errorf("problem %+v, want provider-error, 502, retry_after ≥ 1", p)
		}
		l.quiet(2 * time.Second)
		synctest.Wait()
		if n := e.retries(); n != 2 {
			t.Errorf("WorkerRetries %d, want 2", n)
		}
		if n := len(rec.callTimes()); n != 3 {
			t.Errorf("provider called %d times, want 3 (1 + MaxRetries)", n)
		}
		dls := e.deadLetters()
		if len(dls) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dls))
		}
		if dl := dls[0]; dl.RequestID != job.RequestID || dl.Attempt != 1 || !strings.Contains(dl.Reason, "2 retries") {
			t.Errorf("dead letter %+v, want request %s, attempt 1, a reason naming 2 retries", dl, job.RequestID)
		}
		if got := e.settled(); got[metrics.JobDeadLetter] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want dead_letter once", got)
		}
		if d := e.depth(); d != 0 {
			t.Errorf("queue depth %d, want 0", d)
		}
	})
}

func TestWorkerMidstreamFailureAfterPublishIsNotRetried(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		// The simulator fails before chunk 7 of 12.
		rec := &recorder{Provider: newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond,
			Tokens: 12, Seed: 2, FailMidstreamRate: 1})}
		cfg := workerConfig()
		cfg.BatchSize = 2
		job := newJob("mid-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), rec)
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		last := rs[len(rs)-1]
		if last.res.Kind != protocol.KindError || last.res.Problem.Slug() != protocol.ProblemProviderError {
			t.Fatalf("messages %s, want a provider-error ERROR last", describe(rs))
		}
		// Batches [1] [2 3] [4 5] went out; chunk 6, still in its batch when
		// the call failed, is dropped rather than sent before the ERROR.
		checkChunks(t, batches(rs), llm.SimChunks(job.Payload.Messages, 2, 12)[:5])
		l.quiet(5 * time.Second)
		synctest.Wait()
		if n := len(rec.callTimes()); n != 1 || e.retries() != 0 {
			t.Errorf("provider called %d times, %d retries: chunks reached the client, want no retry", n, e.retries())
		}
		if got := e.settled(); got[metrics.JobError] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want error once", got)
		}
		if n := len(e.deadLetters()); n != 0 {
			t.Errorf("%d dead letters, want none", n)
		}
		if d := e.depth(); d != 0 {
			t.Errorf("queue depth %d, want 0 (acknowledged)", d)
		}
	})
}

// The first chunk is published the moment the provider gives it, not when
// its batch fills or times out: a queued client's time to first chunk does
// not pay for batching.
func TestWorkerSendsFirstChunkAtOnce(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: time.Second, Tokens: 3, Seed: 4})
		cfg := workerConfig()
		cfg.BatchSize = 100
		cfg.BatchTimeout = 10 * time.Second
		job := newJob("first-1")
		l := e.listen(job.RequestID)
		e.startWorker(cfg, e.q.Consumer("w1"), sim)
		e.enqueue(job)
		start := time.Now()
		for {
			r := l.must(10 * time.Second)
			if r.res.Kind == protocol.KindHeartbeat {
				continue
			}
			if r.res.Kind != protocol.KindBatch || len(r.res.Chunks) != 1 || r.res.Chunks[0].Seq != 1 {
				t.Fatalf("first message %q, want a batch of chunk 1 alone", r.raw)
			}
			break
		}
		// Fake clock: the chunk came with the provider's first token, long
		// before the 10s batch timeout or a full batch.
		if waited := time.Since(start); waited > 100*time.Millisecond {
			t.Fatalf("first chunk after %v", waited)
		}
		rs := l.untilEnd(time.Minute)
		if rs[len(rs)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s, want DONE last", describe(rs))
		}
	})
}

func TestWorkerSkipsJobs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		prepare func(e *env, job *protocol.Job)
		outcome string
	}{
		{"cancel key set", func(e *env, job *protocol.Job) {
			e.cancel(job.RequestID)
		}, metrics.JobCancelled},
		{"deadline passed on attempt 1", func(_ *env, job *protocol.Job) {
			job.EnqueueTime = time.Now().Add(-31 * time.Second)
			job.Deadline = time.Now().Add(-time.Second)
		}, metrics.JobExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, 15*time.Second, 4)
				rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 4, Seed: 1})}
				job := newJob("skip-1")
				tc.prepare(e, &job)
				l := e.listen(job.RequestID)
				e.startWorker(workerConfig(), e.q.Consumer("w1"), rec)
				e.enqueue(job)

				l.quiet(5 * time.Second)
				synctest.Wait()
				if got := e.settled(); got[tc.outcome] != 1 || len(got) != 1 {
					t.Errorf("job outcomes %v, want %s once", got, tc.outcome)
				}
				if n := len(rec.callTimes()); n != 0 {
					t.Errorf("provider called %d times for a skipped job", n)
				}
				if d := e.depth(); d != 0 {
					t.Errorf("queue depth %d, want 0 (acknowledged)", d)
				}
				if n := len(e.deadLetters()); n != 0 {
					t.Errorf("%d dead letters, want none", n)
				}
			})
		})
	}
}

func TestWorkerTakeoverRunsPastDeadlineWithReset(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const reclaimIdle = 2 * time.Second
		e := newEnv(t, reclaimIdle, 4)
		job := newJob("takeover-1")
		job.Deadline = job.EnqueueTime.Add(time.Second)
		l := e.listen(job.RequestID)
		e.enqueue(job)
		// A worker that fetched the job and died: it never touches it.
		ds, err := e.q.Consumer("dead").Fetch(context.Background(), 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Fetch: %v, %d deliveries", err, len(ds))
		}
		sim := newSim(t, llm.SimConfig{Tokens: 6, Seed: 9})
		e.startWorker(workerConfig(), e.q.Consumer("live"), sim)

		rs := l.untilEnd(10 * time.Second)
		if now := time.Now(); now.Before(job.Deadline) {
			t.Fatalf("answered at %v, before the job's deadline: no takeover happened", now)
		}
		body := withoutHeartbeats(rs)
		if len(body) == 0 || body[0].res.Kind != protocol.KindReset {
			t.Fatalf("messages %s, want SIGNAL:RESET before anything but heartbeats", describe(rs))
		}
		if body[0].raw != `SIGNAL:RESET:{"attempt":2}` {
			t.Errorf("reset %q, want attempt 2", body[0].raw)
		}
		if body[len(body)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s, want DONE last", describe(rs))
		}
		checkChunks(t, batches(rs), llm.SimChunks(job.Payload.Messages, 9, 6))
		synctest.Wait()
		if got := e.settled(); got[metrics.JobDone] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want done once", got)
		}
		if d := e.depth(); d != 0 {
			t.Errorf("queue depth %d, want 0", d)
		}
	})
}

func TestWorkerCancelNotice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		running bool // false: the job waits for the slot the test holds
	}{
		{"while running", true},
		{"while waiting for a slot", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, 15*time.Second, 1)
				var held pool.Lease
				if !tc.running {
					var err error
					if held, err = e.pool.TryAcquire(context.Background(), "someone-else"); err != nil {
						t.Fatal(err)
					}
				}
				rec := &recorder{Provider: newSim(t, llm.SimConfig{TokenInterval: 100 * time.Millisecond, Tokens: 1000, Seed: 1})}
				cfg := workerConfig()
				cfg.BatchSize = 1
				w := e.startWorker(cfg, e.q.Consumer("w1"), rec)
				job := newJob("cancel-1")
				l := e.listen(job.RequestID)
				e.enqueue(job)
				if r := l.must(time.Second); r.res.Kind != protocol.KindHeartbeat {
					t.Fatalf("first message %q, want a heartbeat", r.raw)
				}
				if tc.running {
					if r := l.must(time.Second); r.res.Kind != protocol.KindBatch {
						t.Fatalf("second message %q, want a batch", r.raw)
					}
				} else {
					synctest.Wait()
					if n := e.pool.Waiting(); n != 1 {
						t.Fatalf("%d jobs wait for a slot, want 1", n)
					}
				}

				cancelledAt := time.Now()
				e.cancel(job.RequestID)
				testutil.Eventually(t, 5*time.Second, func() bool { return e.jobs(metrics.JobCancelled) == 1 }, "job cancelled")
				if took := time.Since(cancelledAt); took >= time.Second {
					t.Errorf("job cancelled %v after the notice, want well under a second", took)
				}
				synctest.Wait()
				if got := e.settled(); len(got) != 1 {
					t.Errorf("job outcomes %v, want cancelled only", got)
				}
				if n := w.Running(); n != 0 {
					t.Errorf("worker still runs %d jobs", n)
				}
				if tc.running {
					if s := e.pool.Stats(); s.InUse != 0 {
						t.Errorf("%d pool slots in use after the cancel, want 0", s.InUse)
					}
				} else if n := e.pool.Waiting(); n != 0 {
					t.Errorf("%d jobs still wait for a slot", n)
				}
				if d := e.depth(); d != 0 {
					t.Errorf("queue depth %d, want 0 (acknowledged)", d)
				}
				emitted := rec.chunks()
				l.quiet(3 * time.Second) // the client is gone: nothing more, not even ERROR
				if rec.chunks() != emitted {
					t.Errorf("provider kept emitting after the cancel")
				}
				if held != nil {
					held.Release()
				}
			})
		})
	}
}

func TestWorkerCancelsJobNobodyListensTo(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		rec := &recorder{Provider: newSim(t, llm.SimConfig{FirstToken: time.Second, TokenInterval: 100 * time.Millisecond, Tokens: 20, Seed: 1})}
		w := e.startWorker(workerConfig(), e.q.Consumer("w1"), rec)
		e.enqueue(newJob("orphan-1")) // no subscriber on its result channel

		testutil.Eventually(t, 5*time.Second, func() bool { return len(e.settled()) > 0 }, "job settled")
		testutil.AdvanceFakeClock(5 * time.Second) // the bubble's clock: long enough for a full answer
		synctest.Wait()
		if got := e.settled(); got[metrics.JobCancelled] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want cancelled once", got)
		}
		if n := rec.chunks(); n != 0 {
			t.Errorf("provider emitted %d chunks for a job nobody listens to", n)
		}
		if s := e.pool.Stats(); s.InUse != 0 || w.Running() != 0 {
			t.Errorf("%d slots in use, %d jobs running; want none", s.InUse, w.Running())
		}
		if d := e.depth(); d != 0 {
			t.Errorf("queue depth %d, want 0", d)
		}
	})
}

func TestWorkerDeadLettersMalformedJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		cfg := workerConfig()
		cfg.Concurrency = 1 // the next job is fetched only after the bad one
		e.startWorker(cfg, e.q.Consumer("w1"), newSim(t, llm.SimConfig{Tokens: 3, Seed: 1}))
		if err := e.q.Enqueue(context.Background(), "bad-1", []byte(`{"v":1,"request_id":`)); err != nil {
			t.Fatal(err)
		}
		job := newJob("good-1")
		l := e.listen(job.RequestID)
		e.enqueue(job)

		rs := l.untilEnd(10 * time.Second)
		if rs[len(rs)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s: the job after the malformed one was not answered", describe(rs))
		}
		synctest.Wait()
		dls := e.deadLetters()
		if len(dls) != 1 || dls[0].RequestID != "bad-1" || !strings.HasPrefix(dls[0].Reason, "malformed job") {
			t.Fatalf("dead letters %+v, want bad-1 as a malformed job", dls)
		}
		if n := promtest.ToFloat64(e.m.MalformedMessages.WithLabelValues("queue")); n != 1 {
			t.Errorf("MalformedMessages{source=queue} = %v, want 1", n)
		}
		if got := e.settled(); got[metrics.JobDeadLetter] != 1 || got[metrics.JobDone] != 1 || len(got) != 2 {
			t.Errorf("job outcomes %v, want one dead_letter and one done", got)
		}
		if d := e.depth(); d != 0 {
			t.Errorf("queue depth %d, want 0", d)
		}
	})
}

func TestWorkerGracefulStopFinishesJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		// 20 chunks 100ms apart: the answer takes 1.9s, within the grace.
		sim := newSim(t, llm.SimConfig{TokenInterval: 100 * time.Millisecond, Tokens: 20, Seed: 1})
		cfg := workerConfig()
		cfg.StopGrace = 5 * time.Second
		w := e.startWorker(cfg, e.q.Consumer("w1"), sim)
		job := newJob("grace-1")
		l := e.listen(job.RequestID)
		e.enqueue(job)
		if r := l.must(time.Second); r.res.Kind != protocol.KindHeartbeat {
			t.Fatalf("first message %q, want a heartbeat", r.raw)
		}
		if r := l.must(time.Second); r.res.Kind != protocol.KindBatch {
			t.Fatalf("second message %q, want a batch", r.raw)
		}

		stopAt := time.Now()
		w.cancel()
		synctest.Wait()
		e.enqueue(newJob("after-stop")) // must not be fetched any more
		<-w.done
		took := time.Since(stopAt)
		if took >= cfg.StopGrace {
			t.Errorf("Run returned %v after the stop: it waited for the grace, not for the job", took)
		}
		rs := l.untilEnd(time.Second)
		if rs[len(rs)-1].res.Kind != protocol.KindDone {
			t.Fatalf("messages %s, want DONE", describe(rs))
		}
		if got := e.settled(); got[metrics.JobDone] != 1 || len(got) != 1 {
			t.Errorf("job outcomes %v, want done once", got)
		}
		if d := e.depth(); d != 1 {
			t.Errorf("queue depth %d, want 1 (only the job enqueued after the stop)", d)
		}
		ds, err := e.q.Consumer("w2").Fetch(context.Background(), 10)
		if err != nil || len(ds) != 1 || ds[0].Attempt != 1 {
			t.Errorf("Fetch after the stop: %+v, %v; want the later job, never delivered before", ds, err)
		}
	})
}

func TestWorkerGracefulStopLeavesUnfinishedJob(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const reclaimIdle = 2 * time.Second
		e := newEnv(t, reclaimIdle, 4)
		// 1000 chunks 100ms apart: far longer than the grace.
		sim := newSim(t, llm.SimConfig{TokenInterval: 100 * time.Millisecond, Tokens: 1000, Seed: 1})
		cfg := workerConfig()
		cfg.StopGrace = time.Second
		// Batches of 4 chunks, 100ms apart: when the grace ends (2.05s) the
		// chunk of 2s waits in a batch whose timeout would end at 2.5s.
		cfg.BatchTimeout = 500 * time.Millisecond
		cfg.BatchSize = 4
		w := e.startWorker(cfg, e.q.Consumer("w1"), sim)
		job := newJob("grace-2")
		l := e.listen(job.RequestID)
		e.enqueue(job)
		l.must(time.Second)
		testutil.AdvanceFakeClock(1050 * time.Millisecond) // mid-answer, with chunks waiting in a batch

		stopAt := time.Now()
		w.stop()
		if took := time.Since(stopAt); took < cfg.StopGrace || took > cfg.StopGrace+100*time.Millisecond {
			t.Errorf("Run returned %v after the stop, want after the grace of %v", took, cfg.StopGrace)
		}
		stoppedAt := time.Now()
		synctest.Wait()
		if got := e.settled(); len(got) != 0 {
			t.Errorf("job outcomes %v: a job cut off by the stop must not be settled", got)
		}
		if n := w.Running(); n != 0 {
			t.Errorf("%d jobs still running after Run returned", n)
		}
		if s := e.pool.Stats(); s.InUse != 0 {
			t.Errorf("%d pool slots in use after Run returned", s.InUse)
		}
		// The job stays pending and another worker takes it over.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ds, err := e.q.Consumer("w2").Fetch(ctx, 1)
		if err != nil || len(ds) != 1 {
			t.Fatalf("takeover Fetch: %+v, %v", ds, err)
		}
		if got, _ := protocol.DecodeJob(ds[0].Body); got.RequestID != job.RequestID || ds[0].Attempt != 2 {
			t.Errorf("took over %s attempt %d, want %s attempt 2", got.RequestID, ds[0].Attempt, job.RequestID)
		}
		// Nothing is published for the job once Run returned: the new
		// worker's RESET must not be followed by the old worker's chunks.
		synctest.Wait()
		for _, r := range l.drain() {
			if r.res.Kind == protocol.KindDone || r.res.Kind == protocol.KindError {
				t.Errorf("the stopped worker published %q: the client must wait for the takeover", r.raw)
			}
			if r.at.After(stoppedAt) {
				t.Errorf("the stopped worker published %q %v after Run returned", r.raw, r.at.Sub(stoppedAt))
			}
		}
	})
}

func TestWorkerStopsOnClaimLost(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		// The worker's heartbeat (3s) is slower than the reclaim time
		// (2s), so another consumer takes the job over at 2s and the
		// worker's Touch at 3s finds the claim lost.
		const reclaimIdle = 2 * time.Second
		e := newEnv(t, reclaimIdle, 4)
		// Chunks at 10ms + k·100ms, batches of 4: at 3s two chunks wait in
		// the batch with its timeout (1s) still to run.
		sim := newSim(t, llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: 100 * time.Millisecond, Tokens: 1000, Seed: 1})
		cfg := workerConfig()
		cfg.Heartbeat = 3 * time.Second
		cfg.BatchSize = 4
		cfg.BatchTimeout = time.Second
		job := newJob("claim-1")
		l := e.listen(job.RequestID)
		// Worker a fetches once, so that it cannot take the job back later.
		w := e.startWorker(cfg, &fetchOnce{Consumer: e.q.Consumer("a")}, sim)
		e.enqueue(job)
		first := l.must(time.Second)
		start := first.at

		taken := make(chan failover.Delivery, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ds, err := e.q.Consumer("b").Fetch(ctx, 1)
			if err != nil || len(ds) != 1 {
				t.Errorf("takeover Fetch: %+v, %v", ds, err)
				close(taken)
				return
			}
			taken <- ds[0]
		}()
		d, ok := <-taken
		if !ok {
			return
		}
		if d.Attempt != 2 || time.Since(start) != reclaimIdle {
			t.Fatalf("takeover attempt %d after %v, want attempt 2 after %v", d.Attempt, time.Since(start), reclaimIdle)
		}
		testutil.AdvanceFakeClock(10*time.Second - time.Since(start))
		synctest.Wait()

		lost := start.Add(cfg.Heartbeat)
		var last time.Time
		for _, r := range l.drain() {
			if !r.at.Before(lost) {
				t.Errorf("published %q %v after the claim was lost", r.raw, r.at.Sub(lost))
			}
			if r.res.Kind == protocol.KindDone || r.res.Kind == protocol.KindError {
				t.Errorf("published %q for a job it no longer holds", r.raw)
			}
			last = r.at
		}
		if last.Sub(start) < reclaimIdle {
			t.Errorf("last message %v after the start: the worker should have streamed until it noticed the loss", last.Sub(start))
		}
		if got := e.settled(); len(got) != 0 {
			t.Errorf("job outcomes %v: a job taken over must not be settled by its old worker", got)
		}
		if n := w.Running(); n != 0 {
			t.Errorf("%d jobs still running after the claim was lost", n)
		}
		if s := e.pool.Stats(); s.InUse != 0 {
			t.Errorf("%d pool slots in use after the claim was lost", s.InUse)
		}
		if dep := e.depth(); dep != 1 {
			t.Errorf("queue depth %d, want 1 (the new owner holds it)", dep)
		}
		if err := e.q.Consumer("b").Touch(context.Background(), d); err != nil {
			t.Errorf("the new owner lost its claim: %v", err)
		}
	})
}

// gatedSinks is a ResultPublisher whose first publish blocks until gate
// closes.
type gatedSinks struct {
	inner failover.ResultPublisher
	gate  chan struct{}
	once  sync.Once
}

func (g *gatedSinks) ResultsFor(id string) failover.ResultSink {
	return gatedSink{g: g, inner: g.inner.ResultsFor(id)}
}

type gatedSink struct {
	g     *gatedSinks
	inner failover.ResultSink
}

func (s gatedSink) Publish(ctx context.Context, msg []byte) (bool, error) {
	s.g.once.Do(func() { <-s.g.gate })
	return s.inner.Publish(ctx, msg)
}

func (s gatedSink) PublishPair(ctx context.Context, first, second []byte) (bool, error) {
	s.g.once.Do(func() { <-s.g.gate })
	return s.inner.PublishPair(ctx, first, second)
}

// askingPool is a pool that says when it was first asked for a slot.
type askingPool struct {
	*pool.Local
	asked chan struct{}
	once  sync.Once
}

func (p *askingPool) AcquireOrDefer(ctx context.Context, user string, since time.Time) (pool.Lease, error) {
	p.once.Do(func() { close(p.asked) })
	return p.Local.AcquireOrDefer(ctx, user, since)
}

// The worker asks for its pool slot while its first heartbeat is still on
// its way, not after; the results keep their order all the same.
func TestWorkerAsksForSlotWhileFirstHeartbeatGoesOut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, 15*time.Second, 4)
		sim := newSim(t, llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: time.Millisecond, Tokens: 6, Seed: 7})
		sinks := &gatedSinks{inner: e.res, gate: make(chan struct{})}
		p := &askingPool{Local: e.pool, asked: make(chan struct{})}
		w, err := worker.New(workerConfig(), worker.Deps{
			Consumer: e.q.Consumer("w1"), Pool: p, Provider: sim, Results: sinks, Cancels: e.res, Metrics: e.m,
			Log: testutil.DiscardLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(ctx) }()
		defer func() { cancel(); <-done }()
		job := newJob("beat-1")
		l := e.listen(job.RequestID)
		e.enqueue(job)
		select {
		case <-p.asked:
		case <-time.After(10 * time.Second):
			close(sinks.gate)
			t.Fatal("no slot asked for while the first heartbeat was held")
		}
		close(sinks.gate)
		rs := l.untilEnd(10 * time.Second)
		want := []protocol.ResultKind{protocol.KindHeartbeat, protocol.KindBatch, protocol.KindBatch, protocol.KindDone}
		if !slices.Equal(kinds(rs), want) {
			t.Fatalf("messages %s, want kinds %v", describe(rs), want)
		}
	})
}

// askedPool is a pool that announces the first slot asked of it (asked
// closes) before it asks its own pool.
type askedPool struct {
	pool.Pool
	asked chan struct{}
	once  sync.Once
}

func (p *askedPool) Acquire(ctx context.Context, user string) (pool.Lease, error) {
	p.once.Do(func() { close(p.asked) })
	return p.Pool.Acquire(ctx, user)
}

// checkingCancels is the env's cancel watcher whose cancel check answers
// gone after it noted whether the job's slot was already asked for (it
// waits up to a second of the bubble's clock for that) and how many
// provider calls had started by then.
type checkingCancels struct {
	*memresults.Memory
	asked      <-chan struct{}
	rec        *recorder
	gone       bool
	overlapped atomic.Bool
	callsSeen  atomic.Int32
}

func (c *checkingCancels) Cancelled(context.Context, string) (bool, error) {
	select {
	case <-c.asked:
		c.overlapped.Store(true)
	case <-time.After(time.Second):
	}
	c.callsSeen.Store(int32(len(c.rec.callTimes())))
	return c.gone, nil
}

// The check whether a job's client left runs while the job asks for its
// slot, not before: the provider is called one round trip sooner. It is
// still called only once the check found the client there; a client gone
// before start hears nothing, the provider is never called and the slot
// is given back.
func TestWorkerChecksCancelWhileAskingForASlot(t *testing.T) {
	t.Parallel()
	for _, gone := range []bool{false, true} {
		t.Run("gone="+strconv.FormatBool(gone), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, 15*time.Second, 4)
				rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 4, Seed: 1})}
				p := &askedPool{Pool: e.pool, asked: make(chan struct{})}
				cancels := &checkingCancels{Memory: e.res, asked: p.asked, rec: rec, gone: gone}
				e.runWorker(workerConfig(), worker.Deps{
					Consumer: e.q.Consumer("w1"), Pool: p, Provider: rec, Results: e.res, Cancels: cancels, Metrics: e.m,
					Log: testutil.DiscardLogger(),
				})
				job := newJob("overlap-1")
				l := e.listen(job.RequestID)
				e.enqueue(job)

				if gone {
					l.quiet(5 * time.Second)
				} else {
					rs := l.untilEnd(10 * time.Second)
					if rs[0].res.Kind != protocol.KindHeartbeat || rs[len(rs)-1].res.Kind != protocol.KindDone {
						t.Fatalf("messages %s, want a heartbeat first and DONE last", describe(rs))
					}
				}
				synctest.Wait()
				if !cancels.overlapped.Load() {
					t.Error("the cancel check answered before the slot was asked for: the two ran one after the other")
				}
				if n := cancels.callsSeen.Load(); n != 0 {
					t.Errorf("%d provider calls before the cancel check answered, want 0", n)
				}
				wantCalls, wantOutcome := 1, metrics.JobDone
				if gone {
					wantCalls, wantOutcome = 0, metrics.JobCancelled
				}
				if n := len(rec.callTimes()); n != wantCalls {
					t.Errorf("%d provider calls, want %d", n, wantCalls)
				}
				if got := e.settled(); got[wantOutcome] != 1 || len(got) != 1 {
					t.Errorf("job outcomes %v, want %s once", got, wantOutcome)
				}
				if s := e.pool.Stats(); s.InUse != 0 {
					t.Errorf("%d pool slots in use after the job, want 0", s.InUse)
				}
			})
		})
	}
}

// checkedConsumer delivers its jobs as a backend that looked up their
// cancel key on the way (Delivery.CancelChecked), answering gone.
type checkedConsumer struct {
	failover.Consumer
	gone bool
}

func (c checkedConsumer) Fetch(ctx context.Context, max int) ([]failover.Delivery, error) {
	ds, err := c.Consumer.Fetch(ctx, max)
	for i := range ds {
		ds[i].CancelChecked, ds[i].Cancelled = true, c.gone
	}
	return ds, err
}

// countingCancels is a cancel watcher whose check answers the opposite of
// what the delivery carried and counts how often it was asked.
type countingCancels struct {
	*memresults.Memory
	gone  bool
	asked atomic.Int32
}

func (c *countingCancels) Cancelled(context.Context, string) (bool, error) {
	c.asked.Add(1)
	return c.gone, nil
}

// A delivery whose backend already looked up the cancel key (next.lua on
// a single Redis) is not checked again: the worker takes its answer, so
// the provider is called one round trip sooner. Gone, the job is skipped
// (no provider call, outcome cancelled, slot given back, nothing heard);
// there, it runs, even though a second check would have said gone.
func TestWorkerTakesTheDeliveredCancelCheck(t *testing.T) {
	t.Parallel()
	for _, gone := range []bool{false, true} {
		t.Run("gone="+strconv.FormatBool(gone), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, 15*time.Second, 4)
				rec := &recorder{Provider: newSim(t, llm.SimConfig{Tokens: 4, Seed: 1})}
				cancels := &countingCancels{Memory: e.res, gone: !gone}
				e.runWorker(workerConfig(), worker.Deps{
					Consumer: checkedConsumer{Consumer: e.q.Consumer("w1"), gone: gone}, Pool: e.pool, Provider: rec,
					Results: e.res, Cancels: cancels, Metrics: e.m, Log: testutil.DiscardLogger(),
				})
				job := newJob("checked-1")
				l := e.listen(job.RequestID)
				e.enqueue(job)

				if gone {
					l.quiet(5 * time.Second)
				} else {
					rs := l.untilEnd(10 * time.Second)
					if rs[len(rs)-1].res.Kind != protocol.KindDone {
						t.Fatalf("messages %s, want DONE last", describe(rs))
					}
				}
				synctest.Wait()
				if n := cancels.asked.Load(); n != 0 {
					t.Errorf("cancel key checked %d times, want 0: the delivery had the answer", n)
				}
				wantCalls, wantOutcome := 1, metrics.JobDone
				if gone {
					wantCalls, wantOutcome = 0, metrics.JobCancelled
				}
				if n := len(rec.callTimes()); n != wantCalls {
					t.Errorf("%d provider calls, want %d", n, wantCalls)
				}
				if got := e.settled(); got[wantOutcome] != 1 || len(got) != 1 {
					t.Errorf("job outcomes %v, want %s once", got, wantOutcome)
				}
				if s := e.pool.Stats(); s.InUse != 0 {
					t.Errorf("%d pool slots in use after the job, want 0", s.InUse)
				}
			})
		})
	}
}
