package redisstream

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// maxAckBatch bounds the entries one ack call carries.
const maxAckBatch = 256

// ackTimeout bounds one shared ack call. Each caller waits only as long
// as its own context allows.
const ackTimeout = 5 * time.Second

// acker settles the acknowledgements of many jobs in shared calls (group
// commit, docs/bench-history/2026-11.md, "The queued path's CPU"): an Ack
// on an idle queue goes out at once, alone; the Acks that come while one
// call is out wait for it and go together in the next, one script run per
// shard (ack.lua), instead of a round trip each. Each entry is still
// checked and settled on its own, atomically, as before. Its zero value
// is ready.
type acker struct {
	mu      sync.Mutex
	pending []*ackReq
	running bool // a goroutine is acknowledging
}

// ackReq is one Ack waiting for its call.
type ackReq struct {
	l    *line
	id   string
	done chan error // buffered: the answer never waits for its caller
}

// ack queues the acknowledgement of entry id of line l and waits for its
// answer or for ctx to end. A caller that gave up may still have its
// entry acknowledged, as when a reply is lost.
func (q *Queue) ack(ctx context.Context, l *line, id string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstream: ack %s %s: %w", l.stream, id, err)
	}
	r := &ackReq{l: l, id: id, done: make(chan error, 1)}
	q.acks.mu.Lock()
	q.acks.pending = append(q.acks.pending, r)
	if !q.acks.running {
		q.acks.running = true
		go q.drainAcks()
	}
	q.acks.mu.Unlock()
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("redisstream: ack %s %s: %w", l.stream, id, context.Cause(ctx))
	}
}

// drainAcks acknowledges what was queued until nothing is left.
func (q *Queue) drainAcks() {
	for {
		q.acks.mu.Lock()
		if len(q.acks.pending) == 0 {
			q.acks.running = false
			q.acks.pending = nil // let the backing array go
			q.acks.mu.Unlock()
			return
		}
		n := min(len(q.acks.pending), maxAckBatch)
		batch := slices.Clone(q.acks.pending[:n])
		q.acks.pending = q.acks.pending[n:]
		q.acks.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		for len(batch) > 0 {
			// One script run a shard: its lines share a Cluster slot.
			sh := batch[0].l.shard
			one := make([]*ackReq, 0, len(batch))
			rest := batch[:0]
			for _, r := range batch {
				if r.l.shard == sh {
					one = append(one, r)
				} else {
					rest = append(rest, r)
				}
			}
			q.ackShard(ctx, one)
			batch = rest
		}
		cancel()
	}
}

// ackShard runs ack.lua once for entries of one shard and answers each.
func (q *Queue) ackShard(ctx context.Context, reqs []*ackReq) {
	keys := make([]string, 0, 3)
	args := make([]any, 2, 2+2*len(reqs))
	args[0], args[1] = q.cfg.Group, q.cfg.Consumer
	for _, r := range reqs {
		k := slices.Index(keys, r.l.stream)
		if k < 0 {
			k = len(keys)
			keys = append(keys, r.l.stream)
		}
		args = append(args, k+1, r.id)
	}
	codes, err := ackScript.Run(ctx, q.client, keys, args...).Int64Slice()
	if err == nil && len(codes) != len(reqs) {
		err = fmt.Errorf("%d answers for %d entries", len(codes), len(reqs))
	}
	if err != nil {
		q.noteGroupLost(err)
	}
	for i, r := range reqs {
		switch {
		case err != nil:
			r.done <- fmt.Errorf("redisstream: ack %s %s: %w", r.l.stream, r.id, err)
		case codes[i] < 0:
			r.done <- fmt.Errorf("redisstream: ack %s %s: held by another consumer: %w", r.l.stream, r.id, ErrClaimLost)
		default:
			r.done <- nil
		}
	}
}
