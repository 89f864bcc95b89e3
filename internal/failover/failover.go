// Package failover states the contracts of the spill-over path and holds
// no backend: the job queue (Producer, Consumer, Delivery), the
// per-request result-and-cancel channel (ResultPublisher,
// ResultSubscriber, Canceller, CancelWatcher; resultchannel.go), the queued path as the HTTP
// layer sees it (Spiller, Relay), and the key names (keys.go). The
// protocol behind them is docs/QUEUE.md.
//
// Implementations are siblings: queues in redisstream, kafka and memqueue
// (all pass failovertest.Run), the result channel in results, the api's
// queued path in gateway and the consumer in worker. This package imports
// none of them, nor the HTTP layer (stream), admission or app;
// TestContractsImportNoImplementation holds that.
package failover

import (
	"context"
	"errors"
	"time"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Defaults every queue backend applies to the same setting, written once.
const (
	// DefaultReclaimIdle is QUEUE_RECLAIM_IDLE_SECONDS' default: how long a
	// job may go untouched before another worker takes it over (Redis
	// Streams' idle claim, Kafka's claim TTL, memqueue's reclaim).
	DefaultReclaimIdle = 15 * time.Second
	// DefaultDeadLetterTTL is DEAD_LETTER_TTL_HOURS' default: the Redis
	// dead-letter stream's expiry and the Kafka dead-letter topic's retention.
	DefaultDeadLetterTTL = 168 * time.Hour
)

// ErrClaimLost is returned by Consumer.Touch when this member no longer
// holds the delivery (another member took it over): the caller must stop
// working on it and must not settle it.
var ErrClaimLost = errors.New("failover: claim lost")

// ErrQueueUnavailable wraps backend failures on Enqueue, so the api can
// refuse with 503 instead of hanging.
var ErrQueueUnavailable = errors.New("failover: queue unavailable")

// ErrJobTooLarge wraps Enqueue failures of a job larger than the queue
// takes: unlike ErrQueueUnavailable, trying again will not help, so the
// api refuses the request with 413.
var ErrJobTooLarge = errors.New("failover: job too large for the queue")

// JobLimiter is an optional ability of a Producer, found by type
// assertion: MaxJobBytes is the largest encoded job Enqueue accepts now
// (Kafka's record limit; it may change once the queue checked its topic).
// A Producer without it takes any job protocol.EncodeJob accepts. Safe
// for concurrent use.
type JobLimiter interface {
	MaxJobBytes() int
}

// Delivery is one job handed to a worker by a Consumer.
type Delivery struct {
	// ID identifies the delivery to its backend (a stream entry id, or
	// "partition:offset"); opaque to callers.
	ID string
	// Body is the encoded protocol.Job exactly as enqueued. It may be
	// malformed: the worker decodes it and dead-letters what it cannot.
	Body []byte
	// Attempt is 1 on first delivery and grows with each redelivery or
	// takeover of the same job.
	Attempt int
	// Trace is the job's trace context when the backend carries it beside
	// the body (Kafka record headers), TraceDropped when it carried one
	// out of bounds; the worker uses them when the job has no trace field.
	Trace        *protocol.TraceContext
	TraceDropped bool
	// CancelChecked is set when the backend looked up the job's cancel
	// key (docs/QUEUE.md, "Cancellation") in the same step that delivered
	// it, and Cancelled is then whether the key existed: the worker uses
	// that answer instead of asking again before the provider call (one
	// round trip fewer before the first chunk). Redis Streams on a single
	// Redis does so for the jobs its next.lua takes.
	CancelChecked bool
	Cancelled     bool
}

// Producer enqueues jobs. Safe for concurrent use.
//
// Enqueue returns nil only once the backend durably accepted the job; on
// failure it returns an error wrapping ErrQueueUnavailable (or ctx.Err())
// and the job was not accepted — or, when the answer was lost, may have
// been: workers tolerate a job whose client is gone. A job the backend can
// never take gives an error wrapping ErrJobTooLarge instead.
type Producer interface {
	Enqueue(ctx context.Context, requestID string, body []byte) error
}

// PriorityProducer is an optional ability of a Producer, found by type
// assertion: it enqueues a job in its priority's line, so that workers
// start higher priorities first, FIFO within one, with aging so that low
// never starves (docs/QUEUE.md, "Priority order"). It is safe for
// concurrent use and fails as Enqueue does. A Producer without it (Kafka)
// keeps one line in arrival order; the zero priority is normal.
type PriorityProducer interface {
	EnqueuePriority(ctx context.Context, requestID string, prio protocol.Priority, body []byte) error
}

// Depther reports the backlog: jobs accepted and not yet acknowledged.
type Depther interface {
	Depth(ctx context.Context) (int64, error)
}

// Positioner is an optional ability of a queue, found by type assertion
// on its Producer, that lets a waiting request learn where it stands
// (docs/QUEUE.md, "Queued position"). Safe for concurrent use.
//
// Progress returns how many jobs the consumer group has handed to workers
// since the queue began (a counter that only grows; takeovers do not
// count) and how many jobs wait for a worker now. A job enqueued when
// Progress said (h0, w0) has w0-1 jobs ahead of it; once the counter says
// h, about w0-1-(h-h0) remain ahead. Backends without such counters
// (Kafka) do not implement it, and their requests get no position.
type Positioner interface {
	Progress(ctx context.Context) (handed, waiting int64, err error)
}

// Consumer is one worker process's member of the consumer group. Safe for
// concurrent use by the worker's goroutines.
//
// Fetch blocks until at least one delivery is available or ctx ends (then
// it returns ctx.Err() and no deliveries); it returns at most max
// deliveries, new jobs and jobs taken over from dead members alike. Every
// delivery must end in Ack or DeadLetter, or be left for takeover by
// another member when this process dies or stops. Touch tells the backend
// the job is still being worked on, so it is not taken over; it returns an
// error wrapping ErrClaimLost when another member already took it over.
type Consumer interface {
	Fetch(ctx context.Context, max int) ([]Delivery, error)
	Ack(ctx context.Context, d Delivery) error
	Touch(ctx context.Context, d Delivery) error
	DeadLetter(ctx context.Context, d Delivery, reason string) error
}

// Reclaimer is an optional ability of a Consumer, found by type
// assertion: taking over the jobs of dead members apart from Fetch, so a
// worker takes them over as soon as their member is known dead (its
// claim not refreshed for the reclaim time), whatever room it has for new
// jobs, and before them (docs/QUEUE.md, "Takeover").
//
// Reclaim does not block: it returns at once up to max deliveries whose
// claim went idle, oldest first within a line, each with its grown
// Attempt, and none when there are none. They must end as Fetch's do. On
// failure it returns an error and no delivery; an entry it claimed before
// failing stays pending and is taken over again later. ReclaimInterval is
// how often a worker should call it. Once it has been called, Fetch
// takes no idle job over itself: every takeover goes through Reclaim.
// Safe for concurrent use with Fetch.
type Reclaimer interface {
	Reclaim(ctx context.Context, max int) ([]Delivery, error)
	ReclaimInterval() time.Duration
}
