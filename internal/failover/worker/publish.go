package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// maxRestarts bounds how often one answer starts again from its first chunk
// after a batch could not be published (docs/QUEUE.md, "Fencing and gaps").
const maxRestarts = 3

// Errors of a publish.
var (
	// errFenced: the claim was last refreshed too long ago; another worker
	// may hold the job, so this one must not speak for it any more.
	errFenced = errors.New("claim not refreshed in time; publishing stopped")
	// errAnswerBroken: a batch of the answer was lost for good, so no
	// DONE may follow it.
	errAnswerBroken = errors.New("a batch of the answer was lost")
	// errPublishFailed is the cause a job is cancelled with when its
	// answer could not be delivered even by starting it again.
	errPublishFailed = errors.New("result publish failed")
)

// chanMutex is a mutex made of a channel of one. Publishing holds the lock
// across retries that wait seconds; a goroutine waiting for a channel, unlike
// one waiting for a sync.Mutex, lets a testing/synctest bubble's clock move.
type chanMutex chan struct{}

func (m chanMutex) Lock()   { m <- struct{}{} }
func (m chanMutex) Unlock() { <-m }

// publisher sends results on one job's channel, stamped with the
// delivery's attempt (the fencing token), retrying a failed publish within
// budget. A publish nobody heard means the api stopped listening: the
// client is gone, so the job is cancelled.
type publisher struct {
	results   failover.ResultSink
	requestID string
	attempt   int
	cancel    context.CancelCauseFunc
	log       *slog.Logger
	// budget bounds the retries of one message (Config.PublishBudget).
	budget time.Duration
	// fence is how old the last claim refresh may be before publishing
	// stops (fenceAfter), 0 for no fence.
	fence time.Duration
	// refreshed is when the claim was last known held, in Unix nanoseconds.
	refreshed atomic.Int64

	mu     chanMutex // keeps results in order
	count  int       // chunks handed out since the last reset: DONE's count
	broken bool      // a batch was lost and not made good: no DONE
	fenced bool
}

func (w *Worker) newPublisher(d failover.Delivery, requestID string, cancel context.CancelCauseFunc, log *slog.Logger) *publisher {
	p := &publisher{results: w.deps.Results.ResultsFor(requestID), requestID: requestID, attempt: max(d.Attempt, 1), cancel: cancel, log: log,
		budget: w.cfg.PublishBudget, mu: make(chanMutex, 1)}
	if w.cfg.ReclaimIdle > 0 {
		p.fence = fenceAfter(w.cfg.ReclaimIdle, w.cfg.Heartbeat)
	}
	// The delivery was claimed just now, by Fetch.
	p.claimRefreshed()
	return p
}

// fenceAfter is how old a claim's last refresh may grow before its worker
// stops publishing: one heartbeat before another worker may take the job
// over (reclaimIdle), but never as little as one heartbeat, the normal
// time between two refreshes: with a reclaim time under two heartbeats
// (Kafka's setups allow 3 s and 2 s) the fence sits halfway between the
// heartbeat and the reclaim time, so a live worker is never fenced off.
func fenceAfter(reclaimIdle, heartbeat time.Duration) time.Duration {
	return reclaimIdle - min(heartbeat, (reclaimIdle-heartbeat)/2)
}

// claimRefreshed records a successful claim refresh.
func (p *publisher) claimRefreshed() { p.refreshed.Store(time.Now().UnixNano()) }

// expired reports whether the claim is too old to speak for the job.
func (p *publisher) expired() bool {
	return p.fence > 0 && time.Since(time.Unix(0, p.refreshed.Load())) > p.fence
}

// send publishes r. It returns an error when r did not go out: the worker
// is fenced off, the answer is broken (for a DONE), or every try within
// the budget failed.
func (p *publisher) send(ctx context.Context, r protocol.Result) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sendLocked(ctx, r)
}

// sendAsync starts publishing r, unless first (run before it, on the
// same goroutine) returns false, and returns at once, with a func that
// waits until it went out (or failed, or was not sent). The publisher
// stays locked until then, so every later send follows it: the order of
// results holds.
func (p *publisher) sendAsync(ctx context.Context, r protocol.Result, first func() bool) (wait func()) {
	p.mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer p.mu.Unlock()
		if first() {
			_ = p.sendLocked(ctx, r)
		}
	}()
	return func() { <-done }
}

func (p *publisher) sendLocked(ctx context.Context, r protocol.Result) error {
	if err := p.fenceLocked(); err != nil {
		return err
	}
	msg, err := p.encodeLocked(&r)
	if err != nil {
		return err
	}
	if err := p.sendEncodedLocked(ctx, r.Kind, msg); err != nil {
		return err
	}
	if r.Kind == protocol.KindReset {
		p.count, p.broken = 0, false
	}
	return nil
}

// sendPair publishes an answer's last batch and then its DONE in one
// write (failover.ResultSink.PublishPair): one round trip a stream
// fewer, and the api reads both at once. sent reports whether done went
// out; err is set when the batch may not have: the caller then makes the
// batch good (batcher.restartLocked) and sends done after it. Over a
// broken answer (no DONE may go) the batch goes alone.
func (p *publisher) sendPair(ctx context.Context, batch, done protocol.Result) (sent bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.fenceLocked(); err != nil {
		return false, err
	}
	first, err := p.encodeLocked(&batch)
	if err != nil {
		return false, err
	}
	second, err := p.encodeLocked(&done)
	if err != nil {
		return false, p.sendEncodedLocked(ctx, batch.Kind, first)
	}
	listened, err := p.publish(ctx, func(ctx context.Context) (bool, error) { return p.results.PublishPair(ctx, first, second) })
	if err != nil {
		p.log.Warn("publish failed", "kind", "BATCH and DONE", "budget", p.budget.String(), "err", err)
		return false, err
	}
	p.heardLocked(ctx, listened)
	return true, nil
}

// sendEncodedLocked publishes msg, a result of kind k encoded by
// encodeLocked.
func (p *publisher) sendEncodedLocked(ctx context.Context, k protocol.ResultKind, msg []byte) error {
	listened, err := p.publish(ctx, func(ctx context.Context) (bool, error) { return p.results.Publish(ctx, msg) })
	if err != nil {
		p.log.Warn("publish failed", "kind", k.String(), "budget", p.budget.String(), "err", err)
		return err
	}
	p.heardLocked(ctx, listened)
	return nil
}

// fenceLocked returns errFenced once the claim is too old to speak for
// the job, cancelling the job the first time.
func (p *publisher) fenceLocked() error {
	if p.fenced || p.expired() {
		if !p.fenced {
			p.fenced = true
			p.log.Warn("claim not refreshed within the reclaim time; stopping", "fence", p.fence.String())
			p.cancel(errClaimLost)
		}
		return errFenced
	}
	return nil
}

// encodeLocked stamps r with the attempt (and a DONE with the count of
// chunks, a reset with its attempt) and encodes it. A DONE over a broken
// answer is errAnswerBroken.
func (p *publisher) encodeLocked(r *protocol.Result) ([]byte, error) {
	r.Attempt = p.attempt
	switch r.Kind {
	case protocol.KindBatch:
		p.count = r.Chunks[len(r.Chunks)-1].Seq
	case protocol.KindDone:
		if p.broken {
			return nil, errAnswerBroken
		}
		r.Count = p.count
	case protocol.KindReset:
		r.Reset = &protocol.Reset{Attempt: p.attempt}
	}
	msg, err := protocol.EncodeResult(*r)
	if err != nil {
		p.log.Error("cannot encode result", "kind", r.Kind.String(), "err", err)
		return nil, err
	}
	return msg, nil
}

// heardLocked cancels the job when nobody heard a publish: the api
// stopped listening, so the client is gone.
func (p *publisher) heardLocked(ctx context.Context, listened bool) {
	if !listened && ctx.Err() == nil {
		p.log.Info("nobody listens on the result channel; cancelling the job")
		p.cancel(errClientGone)
	}
}

// publish calls send, retrying with backoff until it goes out or the
// budget is spent. It runs even after the job's context ended, so a final
// ERROR still goes out. A retried message may arrive twice (its first
// reply was lost); the api drops the copy by its sequence.
func (p *publisher) publish(ctx context.Context, send func(context.Context) (bool, error)) (bool, error) {
	try := max(p.budget/2, time.Millisecond)
	op := func() (bool, error) {
		if p.expired() {
			return false, backoff.Permanent(errFenced)
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), try)
		defer cancel()
		return send(pctx)
	}
	// The first try needs none of the retry machinery: a publish almost
	// always goes out at once, several times per answer.
	start := time.Now()
	listened, err := op()
	if err == nil {
		return listened, nil
	}
	if perm, ok := errors.AsType[*backoff.PermanentError](err); ok {
		err = perm.Unwrap()
	} else if left := p.budget - time.Since(start); left > 0 {
		// Retry as if from the first failure: it waits its backoff first.
		bo := backoff.NewExponentialBackOff()
		bo.InitialInterval, bo.MaxInterval = try/10, try/2
		first := err
		again := func() (bool, error) {
			if first != nil {
				e := first
				first = nil
				return false, e
			}
			return op()
		}
		listened, err = backoff.Retry(context.WithoutCancel(ctx), again, backoff.WithBackOff(bo), backoff.WithMaxElapsedTime(left))
	}
	if err != nil {
		return false, fmt.Errorf("publish to %s: %w", p.requestID, err)
	}
	return listened, nil
}

// fail gives the answer up: it could not be delivered even by starting it
// again. The client is told (if the channel works at all) and the job
// ends.
func (p *publisher) fail(ctx context.Context) {
	p.mu.Lock()
	p.broken = true
	p.mu.Unlock()
	p.log.Error("answer could not be delivered; ending the job")
	_ = p.send(ctx, protocol.Result{Kind: protocol.KindError, Problem: protocol.StreamGap(retryAfterSeconds)})
	p.cancel(errPublishFailed)
}

// maxGather is the most chunks one BATCH message gathers while the one
// before it is being published (batcher), unless the batch size is
// larger.
const maxGather = 64

// batcher groups chunks into BATCH messages: a batch goes out once it
// holds size chunks, or timeout after its first chunk, whichever first;
// the answer's very first chunk is sent alone, at once. A full batch is
// published off the provider's goroutine, and while it is out the next
// one gathers every chunk that arrives, up to max(size, maxGather): an
// upstream faster than a publish round trip fills fewer, larger messages
// instead of waiting on one publish per size chunks (docs/QUEUE.md,
// "Batching"). A chunk never waits longer than it did when every batch
// was sent on the provider's goroutine: then it could not even have been
// read while a publish was out. It keeps the whole answer so far, so a
// batch that could not be published is made good by a reset and the
// answer again from its first chunk.
type batcher struct {
	pub     *publisher
	size    int
	limit   int // the most chunks one message carries
	timeout time.Duration

	mu chanMutex
	// answer is every chunk so far, for a restart; answer[taken:] waits
	// to be published. A batch handed to a publish is a slice of it,
	// which appends never write over.
	answer   []protocol.Chunk
	taken    int
	seq      int
	restarts int
	timer    *time.Timer
	// due: what waits goes out whatever its size (its timeout passed,
	// or it holds the first output).
	due bool
	// out, while a goroutine publishes batches, closes when it stops.
	out chan struct{}
	// room, when set, closes when that goroutine takes a batch: add
	// waits for it while a whole message's worth of chunks waits.
	room chan struct{}
	// end, while finish publishes, is the DONE that follows the last
	// batch: publishLocked sends it with that batch.
	end *protocol.Result
	// output is set at the first chunk with model output
	// (protocol.Chunk.Output): the chunks before it (a role preamble)
	// wait, so a failure before any output stays invisible to the
	// client and the call can be retried.
	output bool
}

func newBatcher(pub *publisher, size int, timeout time.Duration) *batcher {
	return &batcher{pub: pub, size: size, limit: max(size, maxGather), timeout: timeout, mu: make(chanMutex, 1)}
}

func (b *batcher) add(ctx context.Context, c protocol.Chunk) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	c.Seq = b.seq
	c.Raw = bytes.Clone(c.Raw) // the provider's only until emit returns
	b.answer = append(b.answer, c)
	if !b.output {
		if !c.Output() {
			return nil // held until the first output, or the end
		}
		// The first output goes out at once, on this goroutine: time to
		// first chunk is what a waiting user feels; batching pays off on
		// the chunks after it.
		b.output = true
		b.due = true
		b.out = make(chan struct{})
		b.publishLocked(ctx, false)
		return nil
	}
	waiting := len(b.answer) - b.taken
	switch {
	case waiting >= b.size:
		b.kickLocked(ctx)
	case waiting == 1 && b.timer == nil:
		b.timer = time.AfterFunc(b.timeout, func() { b.timedOut(ctx) })
	}
	// An upstream far faster than the publishes waits for one: a
	// message carries at most limit chunks.
	for b.out != nil && len(b.answer)-b.taken >= b.limit {
		if b.room == nil {
			b.room = make(chan struct{})
		}
		room := b.room
		b.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
		}
		b.mu.Lock()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// kickLocked has what waits published: by the goroutine publishing now,
// once its batch is out, or by a new one.
func (b *batcher) kickLocked(ctx context.Context) {
	if b.out != nil {
		return
	}
	b.out = make(chan struct{})
	go func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.publishLocked(ctx, false)
	}()
}

// timedOut publishes a partial batch whose timeout passed, on the
// timer's goroutine, or leaves it to the goroutine publishing now.
func (b *batcher) timedOut(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.timer = nil
	if len(b.answer) == b.taken {
		return
	}
	b.due = true
	if b.out == nil {
		b.out = make(chan struct{})
		b.publishLocked(ctx, false)
	}
}

// publishLocked publishes batches while a full one waits (or, with due
// or all, anything waits), then ends the run that b.out marks. It is
// called with b.mu held and b.out set, and unlocks b.mu while it
// publishes. all publishes everything: the answer is complete.
func (b *batcher) publishLocked(ctx context.Context, all bool) {
	defer func() {
		close(b.out)
		b.out = nil
	}()
	for {
		n := len(b.answer) - b.taken
		if n == 0 || n < b.size && !b.due && !all {
			return
		}
		if ctx.Err() != nil {
			// The job was cancelled (client gone, claim lost, worker
			// stopping): nobody may receive more of this attempt.
			b.answer = b.answer[:b.taken]
			return
		}
		n = min(n, b.limit)
		batch := b.answer[b.taken : b.taken+n : b.taken+n]
		b.taken += n
		b.due = false
		if b.timer != nil {
			b.timer.Stop()
			b.timer = nil
		}
		if len(b.answer) > b.taken {
			b.timer = time.AfterFunc(b.timeout, func() { b.timedOut(ctx) })
		}
		if b.room != nil {
			close(b.room)
			b.room = nil
		}
		// The answer's last batch takes its DONE along (finish).
		var end *protocol.Result
		if b.end != nil && b.taken == len(b.answer) {
			end, b.end = b.end, nil
		}
		b.mu.Unlock()
		var err error
		if end != nil {
			var sent bool
			if sent, err = b.pub.sendPair(ctx, protocol.Result{Kind: protocol.KindBatch, Chunks: batch}, *end); !sent {
				b.end = end // finish sends it after the batch was made good
			}
		} else {
			err = b.pub.send(ctx, protocol.Result{Kind: protocol.KindBatch, Chunks: batch})
		}
		b.mu.Lock()
		if err != nil && !errors.Is(err, errFenced) {
			b.restartLocked(ctx)
		}
	}
}

// waitLocked waits until no goroutine publishes batches. It is called
// with b.mu held, which it unlocks while it waits.
func (b *batcher) waitLocked() {
	for b.out != nil {
		out := b.out
		b.mu.Unlock()
		<-out
		b.mu.Lock()
	}
}

// finish publishes every chunk still waiting, after the batch that is
// out, and then done: the answer is complete. The last batch and done go
// in one write (publisher.sendPair); done goes alone when no chunk was
// waiting, or after the last batch was made good. A job cancelled
// meanwhile (client gone, claim lost, worker stopping) gets no done: the
// chunks still waiting were dropped (publishLocked), and a done would
// present what went out as the whole answer. It reports whether done
// went with the whole answer, or was tried after it.
func (b *batcher) finish(ctx context.Context, done protocol.Result) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waitLocked()
	b.out = make(chan struct{})
	b.end = &done
	b.publishLocked(ctx, true)
	if b.end == nil {
		return true
	}
	b.end = nil
	if ctx.Err() != nil {
		return false
	}
	b.mu.Unlock()
	_ = b.pub.send(ctx, done)
	b.mu.Lock()
	return true
}

// restartLocked makes good a batch that could not be published: a reset
// voids what the client has, then the answer so far goes out again from
// its first chunk. When even that fails maxRestarts times, the job ends
// with an error instead of a DONE over a gap.
func (b *batcher) restartLocked(ctx context.Context) {
	for b.restarts < maxRestarts && ctx.Err() == nil {
		b.restarts++
		b.pub.log.Warn("batch lost; restarting the answer from its first chunk", "restart", b.restarts, "chunks", b.taken)
		if err := b.pub.send(ctx, protocol.Result{Kind: protocol.KindReset}); err != nil {
			if errors.Is(err, errFenced) {
				return
			}
			continue
		}
		if b.replayLocked(ctx) {
			return
		}
	}
	if ctx.Err() == nil {
		b.pub.fail(ctx)
	}
}

// replayLocked publishes the answer so far (every chunk handed to a
// publish) in batches; false when one failed.
func (b *batcher) replayLocked(ctx context.Context) bool {
	for i := 0; i < b.taken; i += b.size {
		batch := b.answer[i:min(i+b.size, b.taken)]
		if err := b.pub.send(ctx, protocol.Result{Kind: protocol.KindBatch, Chunks: batch}); err != nil {
			return false
		}
	}
	return true
}

// discard drops the chunks still waiting, waits for the batch that is
// out, and returns how many chunks were handed to a publish.
func (b *batcher) discard() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.answer = b.answer[:b.taken]
	b.waitLocked()
	return b.taken
}
