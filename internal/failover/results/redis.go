// Package results owns the per-request result-and-cancel channel
// (docs/QUEUE.md, "Result channel" and "Cancellation"): both halves of it,
// on Redis and in memory. Publisher is the worker's half (results out,
// cancellations in), Subscriber the api's (results in, cancellations out);
// Memory is both, in one process, for unit tests of the gateway and the
// worker.
package results

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/pubsub"
)

// Publisher is the worker's half on Redis: PUBLISH on the result channel
// (SPUBLISH on a Redis Cluster, where result channels are sharded), EXISTS
// on the cancel key, SUBSCRIBE to the cancel channel. It closes no client
// it is handed.
type Publisher struct {
	prefix  string
	rdb     redis.UniversalClient
	sharded bool
	// results sends every sink's publishes, sharing pipelines between
	// concurrent callers.
	results *combiner
}

var (
	_ failover.ResultPublisher = (*Publisher)(nil)
	_ failover.CancelWatcher   = (*Publisher)(nil)
)

// NewPublisher returns the worker's half on rdb; prefix is QUEUE_PREFIX.
func NewPublisher(prefix string, rdb redis.UniversalClient) (*Publisher, error) {
	if prefix == "" || rdb == nil {
		return nil, errors.New("results: publisher needs a prefix and a redis client")
	}
	_, sharded := rdb.(*redis.ClusterClient)
	return &Publisher{prefix: prefix, rdb: rdb, sharded: sharded, results: &combiner{rdb: rdb, sharded: sharded}}, nil
}

// ResultsFor returns the sink of requestID's result channel.
func (p *Publisher) ResultsFor(requestID string) failover.ResultSink {
	return redisSink{c: p.results, channel: failover.ResultChannel(p.prefix, requestID)}
}

// PublishResult publishes msg on requestID's result channel; listened is
// whether a subscriber received it.
func (p *Publisher) PublishResult(ctx context.Context, requestID string, msg []byte) (bool, error) {
	return p.ResultsFor(requestID).Publish(ctx, msg)
}

// redisSink publishes on one result channel: SPUBLISH on a Redis Cluster
// (sharded Pub/Sub), PUBLISH otherwise, through its Publisher's combiner.
type redisSink struct {
	c       *combiner
	channel string
}

var _ failover.ResultSink = redisSink{}

func (s redisSink) Publish(ctx context.Context, msg []byte) (bool, error) {
	n, err := s.c.publish(ctx, s.channel, msg)
	if err != nil {
		return false, fmt.Errorf("results: publish %s: %w", s.channel, err)
	}
	return n > 0, nil
}

// PublishPair publishes first then second in one pipeline (a worker's
// last batch and its DONE).
func (s redisSink) PublishPair(ctx context.Context, first, second []byte) (bool, error) {
	n1, n2, err := s.c.publishPair(ctx, s.channel, first, second)
	if err != nil {
		return false, fmt.Errorf("results: publish %s: %w", s.channel, err)
	}
	return n1 > 0 && n2 > 0, nil
}

// Cancelled reports whether requestID's cancel key exists. The EXISTS
// shares pipelines with concurrent publishes (combiner).
func (p *Publisher) Cancelled(ctx context.Context, requestID string) (bool, error) {
	key := failover.CancelKey(p.prefix, requestID)
	n, err := p.results.exists(ctx, key)
	if err != nil {
		return false, fmt.Errorf("results: exists %s: %w", key, err)
	}
	return n > 0, nil
}

// WatchCancels subscribes to the cancel channel. The subscription is not
// awaited: go-redis sends SUBSCRIBE and resubscribes after a reconnect on
// its own, and a notice missed meanwhile still reaches a job through its
// cancel key or an unheard publish.
func (p *Publisher) WatchCancels(ctx context.Context) (failover.CancelStream, error) {
	ps := p.rdb.Subscribe(ctx, failover.CancelChannel(p.prefix))
	s := &redisCancels{ps: ps, c: make(chan string), stop: make(chan struct{})}
	s.wg.Go(s.run)
	return s, nil
}

// redisCancels turns a go-redis subscription into request ids.
type redisCancels struct {
	ps   *redis.PubSub
	c    chan string
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (s *redisCancels) run() {
	defer close(s.c)
	for msg := range s.ps.Channel() {
		select {
		case s.c <- msg.Payload:
		case <-s.stop:
			return
		}
	}
}

func (s *redisCancels) C() <-chan string { return s.c }

func (s *redisCancels) Close() {
	s.once.Do(func() {
		close(s.stop)
		_ = s.ps.Close()
		s.wg.Wait()
	})
}

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Prefix is QUEUE_PREFIX. Required.
	Prefix string
	// PubSub sizes the multiplexed Pub/Sub connections; its zero value
	// takes pubsub's documented defaults.
	PubSub pubsub.Config
}

// Validate reports bad values without changing c.
func (c SubscriberConfig) Validate() error {
	var errs []error
	if c.Prefix == "" {
		errs = append(errs, errors.New("results: subscriber Prefix is empty"))
	}
	if err := c.PubSub.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Subscriber is the api's half on Redis: result channels multiplexed over
// a few Pub/Sub connections (package pubsub), and SET plus PUBLISH for a
// cancellation. Close stops its connections; it never closes rdb.
type Subscriber struct {
	prefix string
	rdb    redis.UniversalClient
	sub    *pubsub.Subscriber
}

var (
	_ failover.ResultSubscriber = (*Subscriber)(nil)
	_ failover.Canceller        = (*Subscriber)(nil)
)

// NewSubscriber returns the api's half on rdb.
func NewSubscriber(cfg SubscriberConfig, rdb redis.UniversalClient, log *slog.Logger) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil {
		return nil, errors.New("results: subscriber needs a redis client")
	}
	sub, err := pubsub.New(cfg.PubSub, rdb, log)
	if err != nil {
		return nil, err
	}
	return &Subscriber{prefix: cfg.Prefix, rdb: rdb, sub: sub}, nil
}

// SubscribeResults subscribes to requestID's result channel and returns
// once Redis confirmed it.
func (s *Subscriber) SubscribeResults(ctx context.Context, requestID string) (failover.ResultSubscription, error) {
	sub, err := s.sub.Subscribe(ctx, failover.ResultChannel(s.prefix, requestID))
	if err != nil {
		return nil, err
	}
	return sub, nil
}

// Cancel sets requestID's cancel key for ttl and announces it on the
// cancel channel, in one MULTI so a worker sees both or neither. On a
// cluster the MULTI runs on the cancel key's node (PUBLISH has no key) and
// Redis broadcasts the classic-channel notice to every node.
func (s *Subscriber) Cancel(ctx context.Context, requestID string, ttl time.Duration) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, failover.CancelKey(s.prefix, requestID), "1", ttl)
		p.Publish(ctx, failover.CancelChannel(s.prefix), requestID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("results: cancel %s: %w", requestID, err)
	}
	return nil
}

// Reset ends every result subscription and reconnects (pubsub.Subscriber
// Reset): for a Sentinel failover, whose new primary the old Pub/Sub
// connections do not follow.
func (s *Subscriber) Reset(cause error) { s.sub.Reset(cause) }

// Stats returns the multiplexer's counters.
func (s *Subscriber) Stats() pubsub.Stats { return s.sub.Stats() }

// Close ends every subscription and the Pub/Sub connections.
func (s *Subscriber) Close() error { return s.sub.Close() }
