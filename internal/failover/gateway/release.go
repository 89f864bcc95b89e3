package gateway

import (
	"context"
	"log/slog"
	"sync"
)

// QuotaBatch is a Quota that uncounts many jobs in one call;
// admission.Quota is one. With it, the relays' releases share calls.
type QuotaBatch interface {
	// ReleaseMany uncounts the jobs requestIDs[i] of identities[i], as
	// Quota.Release does each.
	ReleaseMany(ctx context.Context, identities, requestIDs []string) error
}

// maxReleaseBatch bounds the jobs one release call carries.
const maxReleaseBatch = 256

// releaser uncounts the jobs that left the queue off the relays' path
// (docs/bench-history/2026-11.md, "The queued path's CPU"): a relay whose worker
// spoke hands its job over and relays on at once, instead of waiting a
// Redis round trip before the worker's first message goes to the client.
// One goroutine at a time, started when a job is handed over and gone
// once nothing is left, releases everything handed over meanwhile in one
// call (QuotaBatch), so under load many relays' releases share a round
// trip. A release that fails is logged; the entry expires at the job's
// deadline anyway. Safe for concurrent use.
type releaser struct {
	quota Quota
	log   *slog.Logger

	mu         sync.Mutex
	users, ids []string // handed over, not yet released
	running    bool     // a goroutine is releasing
	idle       *sync.Cond
}

func newReleaser(q Quota, log *slog.Logger) *releaser {
	r := &releaser{quota: q, log: log}
	r.idle = sync.NewCond(&r.mu)
	return r
}

// release hands the job over and returns at once.
func (r *releaser) release(identity, requestID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users, r.ids = append(r.users, identity), append(r.ids, requestID)
	if !r.running {
		r.running = true
		go r.drain()
	}
}

// drain releases what was handed over until nothing is left.
func (r *releaser) drain() {
	var users, ids []string
	for {
		r.mu.Lock()
		if len(r.ids) == 0 {
			r.running = false
			r.idle.Broadcast()
			r.mu.Unlock()
			return
		}
		n := min(len(r.ids), maxReleaseBatch)
		users, ids = append(users[:0], r.users[:n]...), append(ids[:0], r.ids[:n]...)
		r.users, r.ids = r.users[n:], r.ids[n:]
		if len(r.ids) == 0 {
			r.users, r.ids = r.users[:0:0], r.ids[:0:0] // let the backing arrays go
		}
		r.mu.Unlock()
		r.releaseNow(users, ids)
	}
}

func (r *releaser) releaseNow(users, ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	if b, ok := r.quota.(QuotaBatch); ok && len(ids) > 1 {
		if err := b.ReleaseMany(ctx, users, ids); err != nil {
			r.log.Warn("queue quota release failed", "jobs", len(ids), "request_id", ids[0], "err", err)
		}
		return
	}
	for i, id := range ids {
		if err := r.quota.Release(ctx, users[i], id); err != nil {
			// The entry expires at the job's deadline anyway.
			r.log.Warn("queue quota release failed", "request_id", id, "err", err)
		}
	}
}

// wait returns once everything handed over so far was released (or
// failed to be).
func (r *releaser) wait() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.running {
		r.idle.Wait()
	}
}
