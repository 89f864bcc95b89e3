package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/shrinkmap"
)

// maxChannelsPerCommand caps one batched SUBSCRIBE or UNSUBSCRIBE, so a
// burst of thousands of requests becomes a few commands of bounded size.
const maxChannelsPerCommand = 1024

var errNoPong = errors.New("pubsub: no reply to ping")

type opKind uint8

const (
	opSubscribe opKind = iota
	opUnsubscribe
	opPing
)

// op is a command queued for a shard's writer; ops are sent in queue order,
// which keeps SUBSCRIBE and UNSUBSCRIBE of one channel in the order the
// reader expects their replies.
type op struct {
	kind    opKind
	channel string
}

// shard is one Redis Pub/Sub connection with its subscriptions.
//
// The PubSub is replaced, not reused, when its connection fails: go-redis
// would reconnect and resubscribe by itself, but messages published during
// the gap are lost, so every subscription of the shard is ended instead
// and the old PubSub (with whatever it resubscribed) is closed. The fresh
// PubSub connects on the next SUBSCRIBE.
type shard struct {
	s   *Subscriber
	idx int
	// client makes the shard's PubSubs: the Subscriber's client, or on a
	// cluster the client of the primary node (its address), which then
	// serves the shard's sharded channels (sharded: SSUBSCRIBE).
	client  redis.UniversalClient
	node    string
	sharded bool

	writeWake chan struct{} // buffered 1: ops were queued
	readWake  chan struct{} // buffered 1: ps became live

	mu     sync.Mutex
	ps     *redis.PubSub
	live   bool // the writer has used ps successfully, so the reader may Receive
	closed bool
	// subs and unsubPending have an entry per open request at most: they
	// give their room back after a burst (shrinkmap).
	subs shrinkmap.Map[string, *Subscription]
	// unsubPending counts UNSUBSCRIBE replies still due per channel on ps.
	unsubPending shrinkmap.Map[string, int]
	ops          []op
	// writing is set while one goroutine sends the queued ops (the
	// writer, or a Subscribe's caller on a live connection): it sends
	// until none is left, so ops queued meanwhile go out with it, in
	// order, and nobody else writes.
	writing bool
	spare   []op // the last batch sent, emptied, reused for the next
}

func newShard(s *Subscriber, idx int, client redis.UniversalClient, node string, sharded bool) *shard {
	return &shard{
		s:         s,
		idx:       idx,
		client:    client,
		node:      node,
		sharded:   sharded,
		writeWake: make(chan struct{}, 1),
		readWake:  make(chan struct{}, 1),
		ps:        client.Subscribe(context.Background()), // no channels: no I/O
	}
}

// sub returns channel's subscription, or nil.
func (sh *shard) sub(channel string) *Subscription {
	sub, _ := sh.subs.Get(channel)
	return sub
}

// register adds a pending subscription and queues its SUBSCRIBE. When
// send is set the caller is to send it (sendQueued) instead of the writer.
func (sh *shard) register(channel string) (_ *Subscription, send bool, _ error) {
	sub := &Subscription{
		sh:        sh,
		channel:   channel,
		confirmed: make(chan struct{}),
		done:      make(chan struct{}),
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return nil, false, fmt.Errorf("%w: %w", ErrUnavailable, ErrClosed)
	}
	if _, ok := sh.subs.Get(channel); ok {
		return nil, false, ErrDuplicate
	}
	sub.waitUnsub, _ = sh.unsubPending.Get(channel)
	sh.subs.Set(channel, sub)
	sh.s.active.Add(1)
	if sh.live && !sh.writing {
		// The connection works and nobody writes: the caller sends its
		// SUBSCRIBE itself (send), saving the writer's wake-up on the way
		// to Redis. Otherwise the writer (or whoever writes now) does.
		sh.ops = append(sh.ops, op{kind: opSubscribe, channel: channel})
		sh.writing = true
		return sub, true, nil
	}
	sh.enqueueLocked(op{kind: opSubscribe, channel: channel})
	return sub, false, nil
}

// sendQueued sends the queued ops, every one queued until none is left,
// and then lets the next writer in. The caller must have set writing.
// The writer calls it when woken, a Subscribe's caller after register
// found the connection live and nobody writing: a write on a live
// connection only fills its socket's buffer (bounded by
// Config.SubscribeTimeout when Redis stops reading), so the caller's
// SUBSCRIBE goes out at once instead of after the writer is scheduled.
func (sh *shard) sendQueued() {
	sh.mu.Lock()
	for !sh.closed && len(sh.ops) > 0 {
		batch := sh.ops
		sh.ops, sh.spare = sh.spare[:0], nil
		ps := sh.ps
		sh.mu.Unlock()
		sh.flush(ps, batch)
		clear(batch)
		sh.mu.Lock()
		sh.spare = batch[:0]
	}
	sh.writing = false
	sh.mu.Unlock()
}

func (sh *shard) enqueueLocked(o op) {
	sh.ops = append(sh.ops, o)
	select {
	case sh.writeWake <- struct{}{}:
	default:
	}
}

// removeLocked ends sub with err (nil: closed by its owner) and queues its
// UNSUBSCRIBE. sub must not have ended yet.
func (sh *shard) removeLocked(sub *Subscription, err error) {
	sub.endLocked(err)
	if sh.sub(sub.channel) == sub {
		sh.subs.Delete(sub.channel)
	}
	sh.s.active.Add(-1)
	if sh.closed {
		return
	}
	n, _ := sh.unsubPending.Get(sub.channel)
	sh.unsubPending.Set(sub.channel, n+1)
	sh.enqueueLocked(op{kind: opUnsubscribe, channel: sub.channel})
}

// endLocked marks sub ended; the caller holds sub.sh.mu, which also
// serialises every send on sub.c with its close.
func (sub *Subscription) endLocked(err error) {
	sub.state = stateEnded
	if sub.c == nil {
		sub.c = closedPayloads // it never got a buffer: none is made to close
	} else {
		close(sub.c)
	}
	if err != nil {
		sub.err = err
		close(sub.done)
	}
	sub.readyLocked()
}

// chanLocked returns sub's channel of payloads, made at its first use:
// a subscription nobody publishes to yet (a job waiting in the queue)
// costs no buffer. The caller holds sub.sh.mu.
func (sub *Subscription) chanLocked() chan []byte {
	if sub.c == nil {
		sub.c = make(chan []byte, sub.sh.s.cfg.Buffer)
	}
	return sub.c
}

// closedPayloads is the channel of every subscription that ended before
// it needed a buffer.
var closedPayloads = func() chan []byte {
	c := make(chan []byte)
	close(c)
	return c
}()

// readyLocked calls the OnReady function, once. The caller holds
// sub.sh.mu.
func (sub *Subscription) readyLocked() {
	if f := sub.ready; f != nil {
		sub.ready = nil
		f()
	}
}

// close ends all subscriptions with ErrClosed and returns the PubSub for
// the Subscriber to close.
func (sh *shard) close() *redis.PubSub {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.closed = true
	for _, sub := range sh.subs.All() {
		sub.endLocked(ErrClosed)
		sh.s.active.Add(-1)
	}
	sh.subs.Reset()
	sh.ops = nil
	return sh.ps
}

// lost handles a failure of ps, seen by the reader or the writer: unless ps
// was replaced already, every subscription ends with ErrConnectionLost and
// a fresh PubSub takes its place.
func (sh *shard) lost(ps *redis.PubSub, cause error) {
	sh.mu.Lock()
	if sh.ps != ps || sh.closed {
		sh.mu.Unlock()
		return
	}
	wasLive := sh.live
	if wasLive {
		// Counted before the subscriptions learn of it, so a handler that
		// saw Done also sees the count.
		sh.s.connectionLosses.Add(1)
	}
	err := fmt.Errorf("%w: %w", ErrConnectionLost, cause)
	n := sh.subs.Len()
	for _, sub := range sh.subs.All() {
		sub.endLocked(err)
	}
	sh.s.active.Add(-int64(n))
	sh.subs.Reset()
	sh.unsubPending.Reset()
	// Queued ops belong to the ended subscriptions or the old connection.
	clear(sh.ops)
	sh.ops = sh.ops[:0]
	sh.ps = sh.client.Subscribe(context.Background())
	sh.live = false
	sh.mu.Unlock()
	// A node connection lost on a cluster is often a failover: the next
	// subscriptions of its slots must go to the promoted replica.
	sh.s.reloadTopology()

	// Closing drops any connection go-redis re-established meanwhile,
	// together with the resubscriptions it made there.
	_ = ps.Close()
	if wasLive {
		sh.s.log.Warn("pubsub: redis connection lost", "shard", sh.idx, "node", sh.node, "subscriptions_ended", n, "err", cause)
	} else if n > 0 {
		sh.s.log.Warn("pubsub: redis unreachable", "shard", sh.idx, "node", sh.node, "subscriptions_ended", n, "err", cause)
	}
}

// writeLoop sends queued ops when woken, unless another goroutine is
// sending them already (sendQueued).
func (sh *shard) writeLoop() {
	defer sh.s.wg.Done()
	for {
		select {
		case <-sh.s.quit:
			return
		case <-sh.writeWake:
		}
		sh.mu.Lock()
		if sh.writing {
			sh.mu.Unlock()
			continue // the goroutine writing sends these too
		}
		sh.writing = true
		sh.mu.Unlock()
		sh.sendQueued()
	}
}

// flush sends batch on ps, grouping runs of the same command. A failed
// write means the connection is gone (or never came up): the shard is
// reset and the rest of the batch is moot.
func (sh *shard) flush(ps *redis.PubSub, batch []op) {
	channels := make([]string, 0, min(len(batch), maxChannelsPerCommand))
	for i := 0; i < len(batch); {
		kind := batch[i].kind
		channels = channels[:0]
		for i < len(batch) && batch[i].kind == kind && len(channels) < maxChannelsPerCommand {
			channels = append(channels, batch[i].channel)
			i++
		}
		ctx, cancel := context.WithTimeout(context.Background(), sh.s.cfg.SubscribeTimeout)
		var err error
		switch {
		case kind == opSubscribe && sh.sharded:
			// One SSUBSCRIBE per channel: a sharded command naming
			// channels of different slots fails with CROSSSLOT, and
			// request ids rarely share a slot.
			for _, ch := range channels {
				if err = ps.SSubscribe(ctx, ch); err != nil {
					break
				}
			}
		case kind == opUnsubscribe && sh.sharded:
			for _, ch := range channels {
				if err = ps.SUnsubscribe(ctx, ch); err != nil {
					break
				}
			}
		case kind == opSubscribe:
			err = ps.Subscribe(ctx, channels...)
		case kind == opUnsubscribe:
			err = ps.Unsubscribe(ctx, channels...)
		default: // opPing
			// One PING answers for any number of queued health checks.
			err = ps.Ping(ctx)
		}
		cancel()
		if err != nil {
			sh.lost(ps, fmt.Errorf("send %s: %w", kindName(kind), err))
			return
		}
		sh.markLive(ps)
	}
}

func kindName(k opKind) string {
	switch k {
	case opSubscribe:
		return "subscribe"
	case opUnsubscribe:
		return "unsubscribe"
	default:
		return "ping"
	}
}

func (sh *shard) markLive(ps *redis.PubSub) {
	sh.mu.Lock()
	wake := sh.ps == ps && !sh.live
	if wake {
		sh.live = true
	}
	sh.mu.Unlock()
	if wake {
		select {
		case sh.readWake <- struct{}{}:
		default:
		}
	}
}

// readLoop is the only caller of Receive on the shard's PubSub. It reads
// only a live PubSub, so an unused shard makes no connection and a shard
// whose connection failed does not redial until the next SUBSCRIBE.
func (sh *shard) readLoop() {
	defer sh.s.wg.Done()
	ctx := context.Background()
	var cur *redis.PubSub
	pingSent := false
	for {
		sh.mu.Lock()
		ps, live, closed := sh.ps, sh.live, sh.closed
		sh.mu.Unlock()
		if closed {
			return
		}
		if !live {
			select {
			case <-sh.s.quit:
				return
			case <-sh.readWake:
			}
			continue
		}
		if ps != cur {
			cur, pingSent = ps, false
		}

		msg, err := ps.ReceiveTimeout(ctx, sh.s.healthInterval)
		if err != nil {
			var rerr redis.Error
			switch {
			case isTimeout(err) && !pingSent:
				pingSent = true
				sh.mu.Lock()
				if sh.ps == ps {
					sh.enqueueLocked(op{kind: opPing})
				}
				sh.mu.Unlock()
			case isTimeout(err):
				sh.lost(ps, errNoPong)
			case sh.sharded && movedSlot(err) >= 0:
				// SSUBSCRIBE reached a node that no longer owns the
				// channel's slot: Subscribe retries on the new owner.
				pingSent = false
				sh.moved(ps, movedSlot(err))
			case errors.As(err, &rerr):
				// The server refused a command (ACL, protocol); the
				// connection itself is in sync and stays.
				pingSent = false
				sh.s.log.Error("pubsub: redis error on pubsub connection", "shard", sh.idx, "node", sh.node, "err", err)
			default:
				sh.lost(ps, err)
			}
			continue
		}
		pingSent = false
		sh.dispatch(ps, msg)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (sh *shard) dispatch(ps *redis.PubSub, msg any) {
	switch m := msg.(type) {
	case *redis.Message:
		sh.route(ps, m.Channel, m.Payload)
	case *redis.Subscription:
		switch m.Kind {
		case "subscribe", "ssubscribe":
			sh.confirm(ps, m.Channel)
		case "unsubscribe", "sunsubscribe":
			sh.unsubscribed(ps, m.Channel)
		}
	case *redis.Pong:
		// Liveness only; handled by the caller.
	default:
		sh.s.log.Debug("pubsub: unexpected pubsub reply", "shard", sh.idx, "type", fmt.Sprintf("%T", msg))
	}
}

func (sh *shard) route(ps *redis.PubSub, channel, payload string) {
	data := []byte(payload)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sub := sh.sub(channel)
	if sh.ps != ps || sub == nil || sub.waitUnsub > 0 {
		sh.s.droppedUnknown.Add(1)
		return
	}
	c := sub.chanLocked()
	if len(c) == cap(c) {
		// Never wait for one slow reader: the others on this shard would
		// stall behind it.
		sh.s.overflows.Add(1)
		sh.removeLocked(sub, ErrOverflow)
		return
	}
	// Every send on sub.c happens here under sh.mu, so a channel with room
	// takes the payload without blocking; counting first means a reader
	// that got the payload also sees it counted.
	sh.s.routed.Add(1)
	c <- data
	sub.readyLocked()
}

func (sh *shard) confirm(ps *redis.PubSub, channel string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sub := sh.sub(channel)
	if sh.ps != ps || sub == nil || sub.state != statePending || sub.waitUnsub > 0 {
		return
	}
	sub.state = stateActive
	close(sub.confirmed)
}

func (sh *shard) unsubscribed(ps *redis.PubSub, channel string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.ps != ps {
		return
	}
	switch n, _ := sh.unsubPending.Get(channel); {
	case n > 1:
		sh.unsubPending.Set(channel, n-1)
	case n == 1:
		sh.unsubPending.Delete(channel)
	case n == 0:
		// Nobody asked: Redis dropped a sharded subscription because its
		// slot left this node. Messages may be lost, so the subscription
		// ends with an error rather than waiting on a silent channel.
		if sub := sh.sub(channel); sub != nil && sub.state != stateEnded {
			sh.dropLocked(sub, ErrMoved)
			sh.s.log.Warn("pubsub: sharded subscription dropped by redis", "node", sh.node, "channel", channel)
		}
		return
	}
	if sub := sh.sub(channel); sub != nil && sub.waitUnsub > 0 {
		sub.waitUnsub--
	}
}

// dropLocked ends sub with err without sending an UNSUBSCRIBE: Redis no
// longer has it (slot moved, or SSUBSCRIBE refused with MOVED).
func (sh *shard) dropLocked(sub *Subscription, err error) {
	sub.endLocked(err)
	if sh.sub(sub.channel) == sub {
		sh.subs.Delete(sub.channel)
	}
	sh.s.active.Add(-1)
}

// moved handles a MOVED reply to SSUBSCRIBE on ps: every subscription of
// the shard still waiting for confirmation whose channel hashes to slot
// ends with ErrMoved (so Subscribe retries it elsewhere), and the cluster
// client reloads its slot map.
func (sh *shard) moved(ps *redis.PubSub, slot int) {
	sh.mu.Lock()
	if sh.ps == ps {
		for _, sub := range sh.subs.All() {
			if sub.state == statePending && sub.waitUnsub == 0 && keySlot(sub.channel) == slot {
				sh.dropLocked(sub, ErrMoved)
			}
		}
	}
	sh.mu.Unlock()
	sh.s.reloadTopology()
}

// movedSlot returns the slot of a "MOVED <slot> <addr>" or
// "ASK <slot> <addr>" error reply, or -1. It reads the text: go-redis
// returns these replies as its own redirection errors, not as redis.Error.
func movedSlot(err error) int {
	msg := err.Error()
	var rest string
	switch {
	case strings.HasPrefix(msg, "MOVED "):
		rest = msg[len("MOVED "):]
	case strings.HasPrefix(msg, "ASK "):
		rest = msg[len("ASK "):]
	default:
		return -1
	}
	field, _, _ := strings.Cut(rest, " ")
	slot, perr := strconv.Atoi(field)
	if perr != nil || slot < 0 || slot >= clusterSlots {
		return -1
	}
	return slot
}

const clusterSlots = 16384

// keySlot is Redis Cluster's slot of a key or sharded channel: CRC16
// (XMODEM) of its hash tag, the part between the first "{" and the next
// "}" when that is non-empty, else of the whole name, modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}
