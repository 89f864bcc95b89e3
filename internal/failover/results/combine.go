package results

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/rediserr"
)

// combiner sends the publishes (and cancel-key checks) of concurrent
// callers in shared pipelines:
// the first caller to find none in flight writes every publish waiting by
// then in one pipeline; callers arriving meanwhile wait, and when it is
// done the first of them leads the next pipeline with whatever waits by
// then. No goroutine of its own, no timer: a lone publish goes out at
// once as before, and under load a pipeline carries many, so a worker
// tier of hundreds of answers writes Redis in a few syscalls per
// round trip instead of two per message.
//
// A waiting caller is bounded by the pipeline it joined, which runs under
// its leader's context (each publish is one attempt with a deadline; the
// worker retries a failed one). Progress never depends on a caller that
// gave up: callers never leave the queue before their publish is done.
type combiner struct {
	rdb     redis.UniversalClient
	sharded bool

	mu      sync.Mutex
	queue   []*publishCall
	leading bool // a caller is writing a pipeline
}

// publishCall is one caller's publish, or with exists its EXISTS of the
// key channel: done closes when n and err are set; lead closes when this
// caller is to write the next pipeline.
type publishCall struct {
	channel string
	msg     []byte
	exists  bool
	// shared: the call was queued right behind another, whose done and
	// lead stand for both (publishPair); it has none of its own.
	shared bool
	n      int64
	err    error
	done   chan struct{}
	lead   chan struct{}
}

// publish sends msg on channel, in a pipeline shared with other callers,
// and returns the number of subscribers that received it.
func (c *combiner) publish(ctx context.Context, channel string, msg []byte) (int64, error) {
	call := &publishCall{channel: channel, msg: msg, done: make(chan struct{}), lead: make(chan struct{})}
	c.do(ctx, call)
	return call.n, call.err
}

// publishPair sends first then second on channel, next to each other in
// one pipeline, and returns the number of subscribers each reached.
func (c *combiner) publishPair(ctx context.Context, channel string, first, second []byte) (n1, n2 int64, err error) {
	a := &publishCall{channel: channel, msg: first, done: make(chan struct{}), lead: make(chan struct{})}
	// The second call is done when the first is (the pipeline carrying
	// both closes the first's done after setting both results) and never
	// leads: it is never first in the queue.
	b := &publishCall{channel: channel, msg: second, shared: true}
	c.do(ctx, a, b)
	if a.err != nil {
		return a.n, b.n, a.err
	}
	return a.n, b.n, b.err
}

// exists reports, as EXISTS does, whether key exists, in a pipeline shared
// with other callers: a worker checks its job's cancel key as it starts
// it, alongside the other jobs' publishes.
func (c *combiner) exists(ctx context.Context, key string) (int64, error) {
	call := &publishCall{channel: key, exists: true, done: make(chan struct{}), lead: make(chan struct{})}
	c.do(ctx, call)
	return call.n, call.err
}

// do queues calls, next to each other, and returns when they are done:
// a leader takes the whole queue, so they go in one pipeline.
func (c *combiner) do(ctx context.Context, calls ...*publishCall) {
	call := calls[0]
	c.mu.Lock()
	c.queue = append(c.queue, calls...)
	if c.leading {
		c.mu.Unlock()
		select {
		case <-call.done:
			return
		case <-call.lead:
		}
		c.mu.Lock()
	}
	c.leading = true
	batch := c.queue
	c.queue = nil
	c.mu.Unlock()

	c.write(ctx, batch)

	c.mu.Lock()
	if len(c.queue) > 0 {
		close(c.queue[0].lead) // it takes the queue, itself included
	} else {
		c.leading = false
	}
	c.mu.Unlock()
}

// write sends batch in one pipeline (a plain call for one publish) and
// completes every call in it.
func (c *combiner) write(ctx context.Context, batch []*publishCall) {
	defer func() {
		for _, call := range batch {
			if !call.shared {
				close(call.done)
			}
		}
	}()
	if len(batch) == 1 {
		call := batch[0]
		call.n, call.err = c.cmd(ctx, c.rdb, call).Result()
		return
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(batch))
	for i, call := range batch {
		cmds[i] = c.cmd(ctx, pipe, call)
	}
	_ = rediserr.Exec(ctx, pipe) // each command carries its own error
	for i, call := range batch {
		call.n, call.err = cmds[i].Result()
	}
}

func (c *combiner) cmd(ctx context.Context, r redis.Cmdable, call *publishCall) *redis.IntCmd {
	if call.exists {
		return r.Exists(ctx, call.channel)
	}
	if c.sharded {
		return r.SPublish(ctx, call.channel, call.msg)
	}
	return r.Publish(ctx, call.channel, call.msg)
}
