// Package pubsub owns the api side of the per-request result channels: it
// multiplexes every channel one api process waits on over a small fixed
// number of Redis Pub/Sub connections, returns from Subscribe only once
// Redis confirmed the subscription (so the job may be enqueued after it),
// and ends a subscription explicitly when its messages can no longer be
// trusted to arrive (connection lost, slot moved, reader too slow).
//
// On a Redis Cluster (a *redis.ClusterClient) it uses sharded Pub/Sub
// (SSUBSCRIBE; the workers SPUBLISH): a sharded channel lives on the
// primary owning its slot, so the Subscriber keeps one set of Config.Shards
// connections per primary, made on first use (docs/OPERATIONS.md, "Redis
// Cluster and Sentinel").
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
)

// Sentinel errors. Match them with errors.Is.
var (
	// ErrUnavailable is wrapped by every Subscribe failure except
	// ErrDuplicate: Redis did not confirm the subscription in time, the
	// connection failed, the caller's context ended, or the Subscriber is
	// closed. The request must not be enqueued.
	ErrUnavailable = errors.New("pubsub: subscription unavailable")
	// ErrDuplicate is returned by Subscribe for a channel that already has a
	// subscription on this Subscriber; each request has its own channel.
	ErrDuplicate = errors.New("pubsub: channel already subscribed")
	// ErrOverflow ends a subscription whose buffer was full when a message
	// arrived: its reader fell behind and the stream has a gap.
	ErrOverflow = fmt.Errorf("pubsub: subscription buffer overflowed: %w", failover.ErrResultOverflow)
	// ErrConnectionLost ends every subscription of a shard whose Redis
	// connection failed: messages published meanwhile are lost.
	ErrConnectionLost = errors.New("pubsub: redis connection lost")
	// ErrClosed ends every subscription when the Subscriber is closed.
	ErrClosed = errors.New("pubsub: subscriber closed")
	// ErrMoved ends a sharded subscription whose slot left the node it was
	// made on (a resharding or failover): Redis dropped it, and messages
	// published during the move may be lost. Subscribe retries a
	// subscription that was not confirmed yet on the slot's new owner.
	ErrMoved = errors.New("pubsub: channel's cluster slot moved")
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultShards is the default Config.Shards.
	DefaultShards = 4
	// DefaultBuffer is the default Config.Buffer.
	DefaultBuffer = 256
	// DefaultSubscribeTimeout is the default Config.SubscribeTimeout.
	DefaultSubscribeTimeout = 5 * time.Second
)

const (
	maxShards = 256
	maxBuffer = 1 << 20
)

// healthInterval is how long a shard's connection may stay silent before
// the shard pings it; a ping still unanswered one interval later counts as
// a lost connection. It catches half-open connections (host gone, no RST)
// that would otherwise leave requests waiting until their own timeout.
const healthInterval = 5 * time.Second

// Config configures a Subscriber. The zero value means all defaults.
type Config struct {
	// Shards is the number of Redis Pub/Sub connections, each with its own
	// reader goroutine; on a Redis Cluster, per primary. Default 4, at most
	// 256.
	Shards int
	// Buffer is the number of messages buffered per subscription before it
	// ends with ErrOverflow. A subscription allocates its buffer (24 bytes
	// a slot) at its first message, or when C is first called. Default
	// 256.
	Buffer int
	// SubscribeTimeout bounds how long Subscribe waits for Redis to
	// confirm a subscription, and each command a shard sends. Default 5s.
	SubscribeTimeout time.Duration
}

// Validate reports whether c is usable. It does not apply defaults.
func (c Config) Validate() error {
	var errs []error
	if c.Shards < 0 || c.Shards > maxShards {
		errs = append(errs, fmt.Errorf("pubsub: shards %d out of range 0..%d", c.Shards, maxShards))
	}
	if c.Buffer < 0 || c.Buffer > maxBuffer {
		errs = append(errs, fmt.Errorf("pubsub: buffer %d out of range 0..%d", c.Buffer, maxBuffer))
	}
	if c.SubscribeTimeout < 0 {
		errs = append(errs, fmt.Errorf("pubsub: negative subscribe timeout %v", c.SubscribeTimeout))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultBuffer
	}
	if c.SubscribeTimeout == 0 {
		c.SubscribeTimeout = DefaultSubscribeTimeout
	}
	return c
}

// Stats is a snapshot of a Subscriber's counters, for metrics.
type Stats struct {
	// Active is the number of subscriptions registered now, confirmed or
	// still waiting for confirmation.
	Active int64
	// Overflows counts subscriptions ended with ErrOverflow.
	Overflows uint64
	// ConnectionLosses counts shard connections that failed after having
	// worked; each ended its shard's subscriptions with ErrConnectionLost.
	ConnectionLosses uint64
	// Routed counts messages handed to a subscription.
	Routed uint64
	// DroppedUnknown counts messages for a channel with no subscription,
	// typically published just after the subscription was closed.
	DroppedUnknown uint64
}

// Subscriber multiplexes result-channel subscriptions over Config.Shards
// Redis Pub/Sub connections (per cluster primary on a Redis Cluster). A
// channel always maps to the same shard (FNV-1a of its name) of the node
// that serves it. Each shard has one reader goroutine, the only caller of its
// PubSub's Receive, which routes messages without ever blocking on a
// subscription, and one writer goroutine that batches SUBSCRIBE,
// UNSUBSCRIBE and PING commands so callers never wait on the connection.
//
// All methods are safe for concurrent use by any number of goroutines.
// Close must be called to stop the goroutines; it never closes the client.
type Subscriber struct {
	cfg    Config
	client redis.UniversalClient
	log    *slog.Logger
	shards []*shard // one Redis; nil on a cluster

	// cluster is set when client is a Redis Cluster: channels are sharded
	// and each primary gets its own shards, made on first use.
	cluster *redis.ClusterClient
	mu      sync.Mutex // guards groups and closed
	groups  map[string][]*shard
	closed  bool

	// healthInterval is healthInterval except in tests that exercise the
	// ping path; set before the first Subscribe.
	healthInterval time.Duration

	quit      chan struct{}
	wg        sync.WaitGroup // readers and writers
	closeOnce sync.Once
	closeErr  error

	active           atomic.Int64
	overflows        atomic.Uint64
	connectionLosses atomic.Uint64
	routed           atomic.Uint64
	droppedUnknown   atomic.Uint64
}

// New returns a Subscriber using client for its Pub/Sub connections. It
// does no I/O: a shard connects on its first Subscribe. A nil log discards.
func New(cfg Config, client redis.UniversalClient, log *slog.Logger) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("pubsub: nil redis client")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Subscriber{
		cfg:            cfg.withDefaults(),
		client:         client,
		log:            log,
		healthInterval: healthInterval,
		quit:           make(chan struct{}),
	}
	if cc, ok := client.(*redis.ClusterClient); ok {
		s.cluster = cc
		s.groups = make(map[string][]*shard)
		return s, nil
	}
	s.shards = s.newShards(client, "", false)
	return s, nil
}

// newShards makes Config.Shards shards on client and starts their
// goroutines; node names the cluster primary ("" for one Redis).
func (s *Subscriber) newShards(client redis.UniversalClient, node string, sharded bool) []*shard {
	shards := make([]*shard, s.cfg.Shards)
	for i := range shards {
		shards[i] = newShard(s, i, client, node, sharded)
	}
	for _, sh := range shards {
		s.wg.Add(2)
		go sh.readLoop()
		go sh.writeLoop()
	}
	return shards
}

// shardFor maps a channel to its shard: on a cluster first to the primary
// owning the channel's slot (which may load the slot map), then within
// that node's shards with 32-bit FNV-1a, inlined so the hot path does not
// allocate a hash.Hash.
func (s *Subscriber) shardFor(ctx context.Context, channel string) (*shard, error) {
	shards := s.shards
	if s.cluster != nil {
		node, err := s.cluster.MasterForKey(ctx, channel)
		if err != nil {
			return nil, fmt.Errorf("%w: find the cluster node of the channel: %w", ErrUnavailable, err)
		}
		addr := node.Options().Addr
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrClosed)
		}
		shards = s.groups[addr]
		if shards == nil {
			shards = s.newShards(node, addr, true)
			s.groups[addr] = shards
		}
		s.mu.Unlock()
	}
	h := uint32(2166136261)
	for i := 0; i < len(channel); i++ {
		h ^= uint32(channel[i])
		h *= 16777619
	}
	return shards[h%uint32(len(shards))], nil
}

// allShards returns every shard made so far.
func (s *Subscriber) allShards() []*shard {
	if s.cluster == nil {
		return s.shards
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var all []*shard
	for _, g := range s.groups {
		all = append(all, g...)
	}
	return all
}

// reloadTopology asks the cluster client to refresh its slot map, after a
// MOVED reply or a lost node connection, so the next subscription of the
// slot goes to the new owner. A no-op on one Redis.
func (s *Subscriber) reloadTopology() {
	if s.cluster != nil {
		s.cluster.ReloadState(context.Background())
	}
}

// Subscribe subscribes to channel and returns once Redis has confirmed the
// subscription: a message published after Subscribe returns is delivered.
//
// It waits at most until ctx ends or Config.SubscribeTimeout passes. On
// failure nothing stays subscribed and the error wraps ErrUnavailable (and
// ctx.Err() when the context ended), or is ErrDuplicate when channel
// already has a subscription here. The caller must Close the returned
// Subscription.
func (s *Subscriber) Subscribe(ctx context.Context, channel string) (*Subscription, error) {
	if channel == "" {
		return nil, fmt.Errorf("pubsub: subscribe: empty channel name: %w", ErrUnavailable)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("pubsub: subscribe %q: %w: %w", channel, ErrUnavailable, err)
	}
	deadline := time.NewTimer(s.cfg.SubscribeTimeout)
	defer deadline.Stop()
	// Only a cluster retries: a subscription that was not confirmed
	// because its slot moved, or its node's connection failed (a failover
	// in progress), is tried again on the slot's owner once the slot map
	// is reloaded, within the same SubscribeTimeout.
	var retry backoff.BackOff = &backoff.StopBackOff{}
	if s.cluster != nil {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval = 50 * time.Millisecond
		b.MaxInterval = time.Second
		retry = b
	}
	for {
		sub, err := s.subscribeOnce(ctx, channel, deadline.C)
		if err == nil || !(errors.Is(err, ErrMoved) || errors.Is(err, ErrConnectionLost)) {
			return sub, err
		}
		wait := retry.NextBackOff()
		if wait == backoff.Stop {
			return nil, err
		}
		s.reloadTopology()
		pause := time.NewTimer(wait)
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return nil, fmt.Errorf("pubsub: subscribe %q: %w: %w", channel, ErrUnavailable, ctx.Err())
		case <-deadline.C:
			pause.Stop()
			return nil, fmt.Errorf("pubsub: subscribe %q: %w: not confirmed within %v (last: %w)",
				channel, ErrUnavailable, s.cfg.SubscribeTimeout, err)
		}
	}
}

// subscribeOnce registers channel on its shard and waits for Redis'
// confirmation, until ctx ends or deadline fires.
func (s *Subscriber) subscribeOnce(ctx context.Context, channel string, deadline <-chan time.Time) (*Subscription, error) {
	sh, err := s.shardFor(ctx, channel)
	if err != nil {
		return nil, fmt.Errorf("pubsub: subscribe %q: %w", channel, err)
	}
	sub, send, err := sh.register(channel)
	if err != nil {
		return nil, fmt.Errorf("pubsub: subscribe %q: %w", channel, err)
	}
	if send {
		sh.sendQueued()
	}
	select {
	case <-sub.confirmed:
		return sub, nil
	case <-sub.done:
		return nil, fmt.Errorf("pubsub: subscribe %q: %w: %w", channel, ErrUnavailable, sub.err)
	case <-ctx.Done():
		sub.Close()
		return nil, fmt.Errorf("pubsub: subscribe %q: %w: %w", channel, ErrUnavailable, ctx.Err())
	case <-deadline:
		sub.Close()
		return nil, fmt.Errorf("pubsub: subscribe %q: %w: not confirmed within %v",
			channel, ErrUnavailable, s.cfg.SubscribeTimeout)
	}
}

// Reset ends every subscription with ErrConnectionLost (wrapping cause)
// and replaces every connection; the next Subscribe connects afresh. Call
// it when the Redis primary changed under the client (a Sentinel
// failover): go-redis moves its command connections to the new primary
// but leaves Pub/Sub connections on the old one, now a replica, where no
// worker's PUBLISH is counted or delivered.
func (s *Subscriber) Reset(cause error) {
	for _, sh := range s.allShards() {
		sh.mu.Lock()
		ps := sh.ps
		sh.mu.Unlock()
		sh.lost(ps, cause)
	}
}

// Stats returns the current counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Active:           s.active.Load(),
		Overflows:        s.overflows.Load(),
		ConnectionLosses: s.connectionLosses.Load(),
		Routed:           s.routed.Load(),
		DroppedUnknown:   s.droppedUnknown.Load(),
	}
}

// Close ends every subscription with ErrClosed, closes the shards' Pub/Sub
// connections and waits for the shard goroutines. Later Subscribe calls
// fail. Close is idempotent; it does not close the Redis client.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		// Shutdown order: first refuse new subscriptions and end the open
		// ones, so no request waits on a channel that can no longer deliver;
		// then stop the writers and close the PubSubs, which interrupts the
		// readers' Receive; last, wait for all shard goroutines.
		s.mu.Lock()
		s.closed = true // no new cluster node shards from here on
		s.mu.Unlock()
		shards := s.allShards()
		pss := make([]*redis.PubSub, 0, len(shards))
		for _, sh := range shards {
			pss = append(pss, sh.close())
		}
		close(s.quit)
		var errs []error
		for _, ps := range pss {
			if err := ps.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
				errs = append(errs, err)
			}
		}
		s.wg.Wait()
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("pubsub: close: %w", err)
		}
	})
	return s.closeErr
}

// subState is where a Subscription is in its life; guarded by shard.mu.
type subState uint8

const (
	statePending subState = iota // SUBSCRIBE queued or sent, not confirmed
	stateActive                  // confirmed by Redis
	stateEnded                   // removed from its shard; c is closed
)

// Subscription is one channel's subscription. C, Done, Err and Close are
// safe for concurrent use; its payloads are meant for one reader, the
// request's handler, which must keep reading: when Config.Buffer payloads
// are waiting, the next one ends the subscription with ErrOverflow.
//
// C is closed whenever the subscription ends, so a handler may range over
// C and then ask Err whether the stream broke; or select on C and Done.
type Subscription struct {
	sh      *shard
	channel string

	c         chan []byte   // made at first use (chanLocked); guarded by sh.mu until then
	ready     func()        // OnReady's function; guarded by sh.mu
	confirmed chan struct{} // closed by the reader on Redis' confirmation
	done      chan struct{} // closed when ended for a reason other than Close
	err       error         // written before done is closed

	// Guarded by sh.mu.
	state subState
	// waitUnsub counts UNSUBSCRIBE replies for this channel still due from
	// an earlier subscription; until they arrived, a "subscribe" reply or
	// message for the channel belongs to that earlier subscription.
	waitUnsub int
}

// Channel returns the Redis channel name.
func (sub *Subscription) Channel() string { return sub.channel }

// C returns the channel of payloads, in publish order. It is closed after
// the subscription ended (by Close or any other reason); payloads buffered
// before the end can still be read.
func (sub *Subscription) C() <-chan []byte {
	sub.sh.mu.Lock()
	defer sub.sh.mu.Unlock()
	return sub.chanLocked()
}

// OnReady arranges for f to be called once, when the subscription has a
// payload to read or has ended (at once when it already has). It lets a
// reader wait with no goroutine of its own: a request waiting in the
// queue costs no goroutine and no buffer until its worker speaks
// (docs/bench-history/2026-11.md, "Waiting streams"). f runs on the shard's reader
// goroutine with the shard locked: it must not block or call back into
// the subscription; starting a goroutine is what it is for. A later call
// replaces an earlier f that has not run.
func (sub *Subscription) OnReady(f func()) {
	sh := sub.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sub.ready = f
	if sub.state == stateEnded || len(sub.c) > 0 {
		sub.readyLocked()
	}
}

// Done returns a channel closed when the subscription ended for a reason
// other than its own Close: Err then tells why (ErrOverflow,
// ErrConnectionLost, ErrClosed). The stream has a gap from that point, so
// the handler should end its client's stream with an error.
func (sub *Subscription) Done() <-chan struct{} { return sub.done }

// Err returns why the subscription ended, or nil while it is active or
// when it was ended by Close.
func (sub *Subscription) Err() error {
	select {
	case <-sub.done:
		return sub.err
	default:
		return nil
	}
}

// Close ends the subscription and sends UNSUBSCRIBE in the background; it
// does not wait for Redis. Messages still in flight for the channel are
// counted in Stats.DroppedUnknown. Close is idempotent.
func (sub *Subscription) Close() {
	sh := sub.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sub.state != stateEnded {
		sh.removeLocked(sub, nil)
	}
}
