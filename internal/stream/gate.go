package stream

import (
	"context"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Gate is the one admission decision the handler asks (admission.Gate
// implements it; docs/OPERATIONS.md, "Admission"). Safe for concurrent
// use; every method answers from cached state, without I/O except Admit's
// rate limit.
type Gate interface {
	// Admit says whether this request, of priority prio, may run at all:
	// nil, or the problem to refuse it with (rate-limited,
	// provider-unavailable).
	Admit(ctx context.Context, identity string, prio protocol.Priority) *protocol.Problem
	// MaxTokens is the cap on an admitted request's max_tokens, 0 for
	// none: the degradation level caps normal requests from level 2. A
	// request that asked for more, or for no limit, gets the cap.
	MaxTokens(prio protocol.Priority) int
	// MayQueue says whether a request of priority prio may join the queue:
	// nil, or the problem to refuse it with (queue-overflow; a lower
	// priority is refused at a smaller backlog).
	MayQueue(prio protocol.Priority) *protocol.Problem
	// QueueFirst says whether jobs wait that could use the slot a new
	// request would take, so it must queue behind them rather than take it.
	QueueFirst() bool
	// RetryAfter is advised to a client refused because the pool is full.
	RetryAfter() time.Duration
	// ServiceDone tells the gate how long a completed direct stream held
	// its slot, which RetryAfter learns from.
	ServiceDone(time.Duration)
}

// openGate admits everything and advises a fixed Retry-After.
type openGate struct{ retryAfter time.Duration }

func (openGate) Admit(context.Context, string, protocol.Priority) *protocol.Problem { return nil }
func (openGate) MaxTokens(protocol.Priority) int                                    { return 0 }
func (openGate) MayQueue(protocol.Priority) *protocol.Problem                       { return nil }
func (openGate) QueueFirst() bool                                                   { return false }
func (g openGate) RetryAfter() time.Duration                                        { return g.retryAfter }
func (openGate) ServiceDone(time.Duration)                                          {}

// Stream outcome label values of spillway_streams_total.
const (
	OutcomeDone      = "done"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
	OutcomeRefused   = "refused"
)

// Metrics is what the handler counts. *metrics.Metrics implements it.
type Metrics interface {
	// PoolRefused counts a direct slot refused, by limit.
	PoolRefused(limit string)
	// StreamOpened counts a stream open on path until closed is called.
	StreamOpened(path string) (closed func())
	// StreamEnded counts a stream by path and outcome.
	StreamEnded(path, outcome string)
	// FirstChunk observes arrival to first chunk on path.
	FirstChunk(path string, d time.Duration)
}

type nopMetrics struct{}

func (nopMetrics) PoolRefused(string)               {}
func (nopMetrics) StreamOpened(string) func()       { return func() {} }
func (nopMetrics) StreamEnded(string, string)       {}
func (nopMetrics) FirstChunk(string, time.Duration) {}
