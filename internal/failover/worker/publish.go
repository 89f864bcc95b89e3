package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// publishTimeout bounds one publish, which runs even after the job's
// context ended so a final ERROR still goes out.
const publishTimeout = 2 * time.Second

// publisher sends results on one job's channel. A publish nobody heard
// means the api stopped listening: the client is gone, so the job is
// cancelled.
type publisher struct {
	results failover.ResultSink
	cancel  context.CancelCauseFunc
	log     *slog.Logger
	mu      sync.Mutex // keeps results in order
}

func (p *publisher) send(ctx context.Context, r protocol.Result) {
	msg, err := protocol.EncodeResult(r)
	if err != nil {
		p.log.Error("cannot encode result", "kind", r.Kind.String(), "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	listened, err := p.results.Publish(pctx, msg)
	switch {
	case err != nil:
		p.log.Warn("publish failed", "kind", r.Kind.String(), "err", err)
	case !listened && ctx.Err() == nil:
		p.log.Info("nobody listens on the result channel; cancelling the job")
		p.cancel(errClientGone)
	}
}

// batcher groups chunks into BATCH messages of at most size chunks, sent
// when full or timeout after the batch's first chunk, whichever first. The
// answer's very first chunk is sent alone, at once.
type batcher struct {
	pub     *publisher
	size    int
	timeout time.Duration

	mu    sync.Mutex
	buf   []protocol.Chunk
	seq   int
	sent  int
	timer *time.Timer
}

func newBatcher(pub *publisher, size int, timeout time.Duration) *batcher {
	return &batcher{pub: pub, size: size, timeout: timeout, buf: make([]protocol.Chunk, 0, size)}
}

func (b *batcher) add(ctx context.Context, content string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	b.buf = append(b.buf, protocol.Chunk{Seq: b.seq, Content: content})
	// The first chunk goes out at once: time to first chunk is what a
	// waiting user feels; batching pays off on the chunks after it.
	if b.seq == 1 || len(b.buf) >= b.size {
		b.flushLocked(ctx)
	} else if len(b.buf) == 1 {
		b.timer = time.AfterFunc(b.timeout, func() { b.flush(ctx) })
	}
	return nil
}

func (b *batcher) flush(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked(ctx)
}

func (b *batcher) flushLocked(ctx context.Context) {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if len(b.buf) == 0 {
		return
	}
	if ctx.Err() != nil {
		// The job was cancelled (client gone, claim lost, worker
		// stopping): nobody may receive more of this attempt.
		b.buf = b.buf[:0]
		return
	}
	b.pub.send(ctx, protocol.Result{Kind: protocol.KindBatch, Chunks: b.buf})
	b.sent += len(b.buf)
	b.buf = make([]protocol.Chunk, 0, b.size)
}

// discard drops unsent chunks and returns how many were published.
func (b *batcher) discard() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.buf = b.buf[:0]
	return b.sent
}
