package failover

import (
	"context"
	"errors"
	"time"
)

// The per-request result-and-cancel channel (docs/QUEUE.md, "Result
// channel" and "Cancellation"): a worker publishes a job's results on
// ResultChannel, which the api subscribed to before it enqueued the job;
// when the client leaves, the api marks the request cancelled (CancelKey)
// and announces it (CancelChannel), so a waiting job is skipped and a
// running one cancelled. The api holds the ResultSubscriber and Canceller
// halves, a worker the ResultPublisher and CancelWatcher halves; package
// results implements all four on Redis and in memory.

// ErrResultOverflow is why a ResultSubscription ends when its reader fell
// behind by more buffered results than the subscriber keeps.
var ErrResultOverflow = errors.New("failover: result subscription overflowed")

// ResultPublisher is the worker's half of the result channel. Safe for
// concurrent use.
//
// ResultsFor returns the sink of requestID's channel, once per job, so the
// channel name is built once rather than per message.
type ResultPublisher interface {
	ResultsFor(requestID string) ResultSink
}

// ResultSink publishes one request's results. Safe for concurrent use;
// the caller keeps results in order.
//
// Publish sends one encoded protocol.Result. listened reports whether a
// subscriber received it: false means the api stopped listening, so the
// client is gone. On error the result may or may not have been delivered.
//
// PublishPair sends two, in order, in one write: a worker sends an
// answer's last batch and its DONE so, one round trip and one message
// read by the api fewer a queued stream (docs/QUEUE.md, "Batching").
// listened is whether a subscriber received both. On error either may or
// may not have been delivered, the second never without the first.
type ResultSink interface {
	Publish(ctx context.Context, msg []byte) (listened bool, err error)
	PublishPair(ctx context.Context, first, second []byte) (listened bool, err error)
}

// ResultSubscriber is the api's half of the result channel. Safe for
// concurrent use.
//
// SubscribeResults returns once the subscription is confirmed, so a result
// published after it returns is delivered; only then may the job be
// enqueued. On error nothing stays subscribed. The caller closes the
// subscription.
type ResultSubscriber interface {
	SubscribeResults(ctx context.Context, requestID string) (ResultSubscription, error)
}

// ResultSubscription is one request's subscription. Its methods are safe
// for concurrent use; its results are meant for one reader, which must
// keep reading (a reader too far behind ends it with ErrResultOverflow).
//
// C delivers encoded results in publish order and is closed once the
// subscription ended. Done is closed when it ended for a reason other than
// Close; Err then says why (wrapping ErrResultOverflow for a slow reader,
// anything else for a lost connection). Close is idempotent.
type ResultSubscription interface {
	C() <-chan []byte
	Done() <-chan struct{}
	Err() error
	Close()
}

// Canceller is the api's half of cancellation. Safe for concurrent use.
//
// Cancel marks requestID cancelled for ttl, so a worker that has not
// started its job skips it, and announces it, so a worker running it
// cancels the provider call. An error means workers may not learn of it:
// the job then runs to its end unheard.
type Canceller interface {
	Cancel(ctx context.Context, requestID string, ttl time.Duration) error
}

// CancelWatcher is the worker's half of cancellation. Safe for concurrent
// use.
//
// Cancelled reports whether requestID was marked cancelled. WatchCancels
// returns the stream of announced cancellations (request ids); the caller
// closes it.
type CancelWatcher interface {
	Cancelled(ctx context.Context, requestID string) (bool, error)
	WatchCancels(ctx context.Context) (CancelStream, error)
}

// CancelStream is a subscription to cancel announcements. C is closed
// after Close. Close is idempotent and waits for the stream's goroutines.
type CancelStream interface {
	C() <-chan string
	Close()
}
