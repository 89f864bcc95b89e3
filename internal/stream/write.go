package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// shuttingDownRetryAfter is the Retry-After, in seconds, of the
// shutting-down problem: another api process takes the retry at once.
const shuttingDownRetryAfter = 1

// attachedCheckTimeout bounds asking Redis whether a resumed client reads
// a stream whose first client left.
const attachedCheckTimeout = time.Second

// session is one request's write loop: one source it reads (source.go:
// the direct call or a queue relay) and one sink it writes (sink.go: the
// dialect's). It numbers the events, hands each to the stream log and,
// while the client is there, to its sink. When the client leaves and a
// resume window is configured, it goes on without one (detached), so the
// answer keeps landing in the log for a resume on any api process.
type session struct {
	h         *Handler
	sink      sink
	resumable bool // the stream is logged and may outlive its client (native dialect only)
	requestID string
	owner     string
	path      string // protocol.PathDirect or PathQueued
	start     time.Time
	src       source
	// finished says whether the source finished (sent done or error),
	// for its relay's Close.
	finished bool
	// stop closes when the owner asked to stop the stream (DELETE).
	stop <-chan struct{}
	// position, on the queued path, follows the job until a worker speaks.
	position *position

	lastID     int64
	terminated bool // a done or error event was emitted
	attached   bool
	firstChunk bool
	// slab holds the data of the chunk events handed to the stream log,
	// which keeps it until its next batch is written (chunkData).
	slab   []byte
	window *time.Timer // runs while detached

	// taken is the writer that took the connection over from net/http
	// (Writer.takeOver), if one did; gone then closes when the client
	// hangs up.
	taken *Writer
	gone  <-chan struct{}
	// req, until a worker speaks, is the request of a queued stream whose
	// writer may still take the connection over (mayTakeOver).
	req *http.Request
	// parked: the loop goes on off the handler's goroutine (Handler.park),
	// traced in parkSpan.
	parked   bool
	parkSpan trace.Span
	released bool

	// The loop's state, set by begin and open.
	closed     func()
	clientGone <-chan struct{} // the request's Done or gone; nil once seen
	heartbeat  *time.Timer
	// woken is when the loop last handled a wake that may have written:
	// the heartbeat is due Heartbeat after it (wakeHeartbeat).
	woken     time.Time
	ticker    *time.Ticker     // queued positions; nil without
	positions <-chan time.Time // ticker's channel until a worker speaks
	// ctx is the request's, holding its server span; problemType is the
	// type of the problem the stream ended with, for the span's outcome.
	ctx         context.Context
	problemType string

	// inline: the direct path's producer writes its chunks itself, on
	// its own goroutine, under mu (chunkInline), rather than waking this
	// loop for each (docs/ARCHITECTURE.md, "Direct path"). The loop
	// holds mu whenever it is not waiting in its select, so what either
	// writes is ordered; poke wakes it when the producer changed what it
	// waits for (a resume window) or ended the stream (ending). over: the
	// loop ended, nothing is written any more.
	inline   bool
	mu       sync.Mutex
	poke     chan<- protocol.Result // the producer's frames
	over     bool
	ending   string // the outcome the producer's failed write ended the stream with
	gathered bool   // the producer's chunks wait in the sink for sendGathered
}

// sessionOf returns the session of x's stream on path, writing x's
// dialect. Only the native dialect is logged and resumable: an OpenAI
// client cannot resume (its chunks carry no ids), so its stream ends when
// it leaves (docs/API.md, "OpenAI-compatible API").
func (h *Handler) sessionOf(x *exchange, path string) *session {
	open := x.open
	if open == nil {
		open = openNative
	}
	return &session{h: h, sink: open(x.w, h.cfg.WriteTimeout), resumable: x.d.resumable(),
		requestID: x.requestID, owner: x.user, path: path, start: x.start}
}

// serve opens the response, then relays frames until a terminal one, the
// owner stops it, the client leaves (and does not come back within the
// resume window), the relay gives up or the server drains. It returns the
// outcome, and whether the source itself finished (sent done or error).
// A queued stream whose writer took its connection over parks instead
// (s.parked, see Handler.park): serve then returns at once, and the loop
// goes on in a goroutine of its own.
func (s *session) serve(ctx context.Context) (string, bool) {
	defer func() {
		if !s.parked {
			s.release()
		}
	}()
	if !s.begin(ctx) {
		return s.finish(OutcomeCancelled, false)
	}
	return s.loop()
}

// loop is the write loop, and a queued stream waits in it with every
// frame below it on its goroutine's stack: a stack shrinks at a collection
// only when less than a quarter of it is in use, so the frames under the
// wait decide whether a waiting stream's goroutine keeps 8 or 16 KiB
// (docs/bench-history/2026-11.md, "Waiting streams"). So loop's frame holds little
// more than the select: what comes before the loop runs in begin, each
// wake is handled in woke, and the end in finish, whose frames are gone
// again while the stream waits.
func (s *session) loop() (string, bool) {
	for {
		var res protocol.Result
		var ok bool
		var k wake
		var window <-chan time.Time
		if s.window != nil {
			window = s.window.C
		}
		if s.inline {
			s.mu.Unlock()
		}
		select {
		case res, ok = <-s.src.frames:
			k = wakeFrame
		case <-s.positions:
			k = wakePosition
		case <-s.heartbeat.C:
			k = wakeHeartbeat
		case <-s.src.done:
			k = wakeRelayDone
		case <-s.clientGone:
			k = wakeClientGone
		case <-window:
			k = wakeWindow
		case <-s.stop:
			k = wakeStop
		case <-s.h.draining:
			k = wakeDrain
		}
		if s.inline {
			s.mu.Lock()
		}
		if outcome, finished, end := s.woke(k, &res, ok); end {
			// A stream that ended on the wake it parked on (its first
			// write to the taken-over connection failed) does not park.
			s.parked = false
			return s.finish(outcome, finished)
		}
		if s.parked {
			return "", false
		}
	}
}

// finish closes the stream the loop ended, with outcome; finished says
// whether its source finished.
//
//go:noinline
func (s *session) finish(outcome string, finished bool) (string, bool) {
	s.finished = finished
	s.ended(outcome)
	s.release()
	return outcome, finished
}

// wake says which of serve's cases fired.
type wake uint8

const (
	wakeFrame wake = iota
	wakePosition
	wakeHeartbeat
	wakeRelayDone
	wakeClientGone
	wakeWindow
	wakeStop
	wakeDrain
)

// headerHold is how long a direct stream's status and headers wait for
// its first event to carry them (session.open): far below what a person
// notices, above the first chunk of an upstream that answers from cache
// or a small model on the same network.
const headerHold = 100 * time.Millisecond

// begin registers the stream (metrics, the stop channel, the log), then
// opens it; false when the stream ends before it began.
//
//go:noinline
func (s *session) begin(ctx context.Context) bool {
	s.ctx = ctx
	s.closed = s.h.m.StreamOpened(s.path)
	s.stop = s.h.register(s.requestID)
	if s.h.logw != nil && s.resumable {
		s.h.logw.Open(s.requestID, s.owner)
	}
	return s.open(ctx)
}

// release stops the loop's timers, undoes begin's registrations (the
// stop channel first) and closes the relay of a queued stream, then the
// connection its writer took over. Only the first call does anything.
func (s *session) release() {
	if s.released {
		return
	}
	s.released = true
	if s.heartbeat != nil {
		s.heartbeat.Stop()
	}
	if s.ticker != nil {
		s.ticker.Stop()
	}
	if s.stop != nil {
		s.h.unregister(s.requestID, s.stop)
	}
	if s.closed != nil {
		s.closed()
	}
	if s.src.relay != nil {
		s.src.relay.Close(s.finished)
	}
	if s.taken != nil {
		s.h.giveBack(s.taken)
	}
}

// ended closes the stream once the loop returned with outcome.
//
//go:noinline
func (s *session) ended(outcome string) {
	if !s.terminated {
		// The client left with no window to come back in: the log still
		// gets an end, so a late resume does not wait for one.
		s.attached = false
		_ = s.emit(Event{Name: protocol.EventError, Problem: protocol.Stopped("The client left before the answer was complete.")})
	}
	if s.window != nil {
		s.window.Stop()
	}
	s.h.m.StreamEnded(s.path, outcome)
	s.traceEnd(outcome)
	if s.parkSpan != nil {
		s.parkSpan.End()
	}
}

// open starts the response and the loop's timers; false when the stream
// ends before it began (no client and no resume window).
func (s *session) open(ctx context.Context) bool {
	h := s.h
	// A queued stream's headers and its first position go out in one
	// write (Writer.Start under Hold): one system call fewer a stream.
	gather := s.position != nil
	if gather {
		s.sink.gather()
	}
	// A direct stream's headers go out with its first event, or after
	// headerHold when none came by then (wakeHeartbeat): a provider whose
	// first chunk comes at once then costs one write, as a plain proxy's
	// answer does, and a client still sees the stream open at once.
	lazy := s.path == protocol.PathDirect && !gather
	if sw := s.sink.sse(); lazy && sw != nil {
		sw.StartLazy()
	}
	s.attached = s.sink.start(s.requestID, s.path) == nil
	s.clientGone = ctx.Done()
	if s.gone != nil {
		s.clientGone = s.gone
	}
	if !s.attached && !s.detach() {
		return false
	}
	first := h.cfg.Heartbeat
	if sw := s.sink.sse(); lazy && sw != nil && sw.HeaderPending() {
		// (The OpenAI dialect's answer starts only with its first event,
		// whose status may still be the upstream's: no hold to end.)
		first = min(first, headerHold)
	}
	s.heartbeat = time.NewTimer(first)
	s.firstChunk = true
	if s.position != nil {
		if _, err := s.sendPosition(); err != nil && !s.lose() {
			return false
		}
		if gather && s.attached {
			if err := s.sink.send(); err != nil && !s.lose() {
				return false
			}
		}
		s.ticker = time.NewTicker(positionEvery)
		s.positions = s.ticker.C
	}
	return true
}

// woke handles what woke serve's loop: k, with the frame res (ok false: the
// source closed) for wakeFrame. end reports that the loop is over, with
// its outcome and whether the source finished.
//
//go:noinline
func (s *session) woke(k wake, res *protocol.Result, ok bool) (outcome string, finished, end bool) {
	h := s.h
	if s.ending != "" {
		// The producer's write to the client failed with nothing to go on
		// for (chunkInline).
		return s.ending, false, true
	}
	var err error
	switch k {
	case wakeFrame:
		if !ok {
			if s.src.next != nil {
				if next, ok := s.src.next.handed(); ok {
					// The direct call handed the request to the queue:
					// the loop reads the relay from here on.
					s.src = next
					return "", false, false
				}
			}
			h.log.Error("stream source ended without a terminal event", "request_id", s.requestID, "path", s.path)
			return s.end(protocol.StreamFailed()), false, true
		}
		// A worker has the job: no more positions, and the stream is not
		// waiting any more.
		s.positions = nil
		s.req = nil
		if res.Kind == protocol.KindHeartbeat {
			return "", false, false // worker liveness only; the relay tracks it
		}
		var last bool
		if outcome, last, err = s.writeReady(*res); last {
			return outcome, true, true
		}
	case wakePosition:
		s.mayTakeOver()
		var sent bool
		if sent, err = s.sendPosition(); !sent {
			return "", false, false // nothing written: the heartbeat timer runs on
		}
	case wakeHeartbeat:
		if sw := s.sink.sse(); sw != nil && sw.HeaderPending() {
			// headerHold passed with no event: the headers go alone.
			if s.attached {
				err = sw.FlushHeader()
			}
			break
		}
		s.mayTakeOver()
		// The timer is not reset at every write (a timer update per
		// chunk): it fires Heartbeat after it was last set, and pings only
		// when nothing was written since, else waits out the rest.
		if quiet := time.Since(s.woken); quiet < h.cfg.Heartbeat {
			s.heartbeat.Reset(h.cfg.Heartbeat - quiet)
			return "", false, false
		}
		if s.attached {
			err = s.sink.ping()
		}
	case wakeRelayDone:
		return s.end(s.src.relay.Problem()), false, true
	case wakeClientGone:
		s.clientGone = nil
		if s.attached {
			s.attached = false
			if !s.detach() {
				return OutcomeCancelled, false, true
			}
		}
	case wakeWindow:
		if s.wanted() {
			s.window.Reset(h.cfg.ResumeWindow)
			return "", false, false
		}
		h.log.Info("nobody resumed within the window, stream cancelled", "request_id", s.requestID, "path", s.path)
		s.end(protocol.Stopped("Nobody came back for the answer within the resume window."))
		return OutcomeCancelled, false, true
	case wakeStop:
		s.end(protocol.Stopped("The stream was stopped at its owner's request."))
		return OutcomeCancelled, false, true
	case wakeDrain:
		return s.end(protocol.ShuttingDown(shuttingDownRetryAfter)), false, true
	}
	if err != nil {
		if outcome, end := s.failed(err); end {
			return outcome, false, true
		}
	}
	// Heartbeat on a timer that runs from the last write: a ping after
	// a ping, else checked when the timer fires (wakeHeartbeat).
	s.woken = time.Now()
	if k == wakeHeartbeat {
		s.heartbeat.Reset(h.cfg.Heartbeat)
	}
	return "", false, false
}

// failed handles a failed write to the client: end reports that the
// stream ends, with outcome, else it goes on detached.
func (s *session) failed(err error) (outcome string, end bool) {
	if errors.Is(err, errAnswerEnded) {
		return OutcomeError, true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		s.h.log.Warn("client too slow, stream cut", "request_id", s.requestID, "path", s.path)
	}
	if !s.lose() {
		return OutcomeCancelled, true
	}
	return "", false
}

// errSessionOver is what chunkInline returns once the stream ended: the
// provider call stops, as it does when its context is cancelled.
var errSessionOver = fmt.Errorf("stream: the stream ended: %w", context.Canceled)

// chunkInline writes the direct path's chunk c on the producer's
// goroutine (inline), as the loop's write would: numbered, logged, and
// to the client while it is there. With gather the sink holds it until
// sendGathered, which the provider calls before it waits for the next
// read of the upstream (llm.ReadWatcher): the chunks one read brought go
// out in one write; without, it goes out at once. A failed write detaches
// the stream (the loop is poked to wait on the resume window) or ends it
// (ending, and errSessionOver).
func (s *session) chunkInline(c protocol.Chunk, gather bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.over || s.ending != "" || s.terminated {
		return errSessionOver
	}
	if s.firstChunk {
		s.firstChunk = false
		s.firstChunkWritten()
	}
	if s.attached && gather {
		s.sink.gather()
		s.gathered = true
	}
	err := s.sink.chunk(s, c)
	if err == nil && !gather {
		s.woken = time.Now()
	}
	return s.lostInline(err)
}

// sendGathered sends what chunkInline gathered, if anything.
func (s *session) sendGathered() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.gathered || s.over {
		return
	}
	s.gathered = false
	if !s.attached {
		return // nothing is sent to a client that left
	}
	s.woken = time.Now()
	_ = s.lostInline(s.sink.send())
}

// lostInline handles chunkInline's and sendGathered's failed write, err:
// the stream goes on detached, the loop poked to wait on the resume
// window, or it ends.
func (s *session) lostInline(err error) error {
	if err == nil || !s.attached {
		return nil
	}
	outcome, end := s.failed(err)
	if end {
		s.ending = outcome
	}
	// A heartbeat on the producer's own frames wakes the loop (a case of
	// its own in the loop's select would make every waiting stream's
	// stack larger: TestWaitingStreamStacksShrink).
	select {
	case s.poke <- protocol.Result{Kind: protocol.KindHeartbeat}:
	default: // frames wait for the loop already: it wakes to them
	}
	if end {
		return errSessionOver
	}
	return nil
}

// mayTakeOver lets the writer of a queued stream that has waited
// TakeOverAfter for a worker take its connection over from net/http
// (takeover.go): a stream that gets its worker soon keeps its keep-alive
// connection and costs nothing more, one that waits keeps one goroutine.
// Tried once a stream, at the first heartbeat or position after that.
func (s *session) mayTakeOver() {
	if s.req == nil || !s.attached || time.Since(s.start) < s.h.cfg.TakeOverAfter {
		return
	}
	r := s.req
	s.req = nil
	s.h.takeOver(s, r)
	if s.gone == nil {
		return
	}
	if s.clientGone != nil {
		s.clientGone = s.gone
	}
	// Nothing of the handler's is needed any more: the stream parks, and
	// its handler returns.
	s.parked = true
}

// maxCoalesce bounds how many frames one write gathers, so a producer
// that never pauses still sees its chunks flushed regularly.
const maxCoalesce = 64

// writeReady writes res and every frame already waiting behind it in one
// write and one flush (docs/bench-history/2026-11.md, "Per chunk: no allocation, no
// full decode"): chunks that are ready at the same moment cost one system
// call. A terminal frame is written at once, with what came before it.
func (s *session) writeReady(res protocol.Result) (outcome string, end bool, err error) {
	if !s.attached {
		return s.write(res)
	}
	s.sink.gather()
	outcome, end, err = s.write(res)
	for n := 1; !end && err == nil && n < maxCoalesce; n++ {
		select {
		case next, ok := <-s.src.frames:
			if !ok {
				n = maxCoalesce // the loop's next receive sees the close again
				continue
			}
			if next.Kind == protocol.KindHeartbeat {
				continue
			}
			outcome, end, err = s.write(next)
		default:
			n = maxCoalesce
		}
	}
	if ferr := s.sink.send(); err == nil && !end {
		err = ferr
	}
	return outcome, end, err
}

// sendPosition sends a queued event when the position is worth one; sent
// reports whether it did.
func (s *session) sendPosition() (sent bool, err error) {
	q, ok := s.position.next(time.Now())
	if !ok {
		return false, nil
	}
	return true, s.emit(Event{Name: protocol.EventQueued, Queued: q})
}

// lose notes a failed write to the client; it reports whether the stream
// goes on detached.
func (s *session) lose() bool {
	if !s.attached {
		return true
	}
	s.attached = false
	return s.detach()
}

// detach goes on without a client for the resume window, when there is
// one and a log to resume from; it reports whether the stream goes on.
func (s *session) detach() bool {
	h := s.h
	if !s.resumable || h.cfg.ResumeWindow <= 0 || h.logw == nil {
		return false
	}
	if s.window == nil {
		s.window = time.NewTimer(h.cfg.ResumeWindow)
	}
	return true
}

// wanted reports whether a resumed client reads the stream now.
func (s *session) wanted() bool {
	if s.h.logr == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), attachedCheckTimeout)
	defer cancel()
	ok, err := s.h.logr.Attached(ctx, s.requestID)
	if err != nil {
		s.h.log.Warn("could not tell whether a client resumed", "request_id", s.requestID, "err", err)
	}
	return ok
}

// end ends the stream with p: outcome error, or cancelled when the client
// did not get it.
func (s *session) end(p *protocol.Problem) string {
	s.problemType = p.Type
	if s.emit(Event{Name: protocol.EventError, Problem: p}) != nil || !s.attached {
		return OutcomeCancelled
	}
	return OutcomeError
}

// emit numbers ev, encodes the data of a named event, logs it and writes
// it to the client when there is one. A chunk event comes from the sink
// (sink.chunk), with its data when the stream is logged. An error is a
// failed write to the client.
func (s *session) emit(ev Event) error {
	s.lastID++
	ev.ID = s.lastID
	if ev.Name != "" {
		ev = ev.encoded()
	}
	if ev.Terminal() {
		s.terminated = true
	}
	if s.logged() {
		s.h.logw.Append(s.requestID, streamlog.Event{ID: ev.ID, Name: ev.Name, Data: ev.Data})
	}
	if !s.attached {
		return nil
	}
	return s.sink.event(ev)
}

// logged reports whether the stream's events go to the stream log.
func (s *session) logged() bool { return s.resumable && s.h.logw != nil }

// write writes one frame. end reports a terminal frame, whose outcome is
// then final; err is a failed write to the client.
func (s *session) write(res protocol.Result) (outcome string, end bool, err error) {
	switch res.Kind {
	case protocol.KindBatch:
		if s.firstChunk {
			s.firstChunk = false
			s.firstChunkWritten()
		}
		attached := s.attached
		for _, c := range res.Chunks {
			if e := s.sink.chunk(s, c); e != nil && err == nil {
				// Keep numbering and logging the rest: a resume wants them.
				err = e
				s.attached = false
			}
		}
		s.attached = attached // lose() decides what a failure means
		return "", false, err
	case protocol.KindReset:
		r := res.Reset
		if r == nil {
			r = &protocol.Reset{}
		}
		telemetry.Reset(trace.SpanFromContext(s.ctx), r.Attempt)
		return "", false, s.emit(Event{Name: protocol.EventReset, Reset: r})
	case protocol.KindRetrying:
		return "", false, s.emit(Event{Name: protocol.EventRetrying, Retrying: res.Retrying})
	case protocol.KindDone:
		d := protocol.Done{RequestID: s.requestID, Path: s.path, FinishReason: "stop"}
		if res.Done != nil {
			// A direct request handed to the queue is answered by a worker:
			// its done says queued (docs/API.md, "Hand-off to the queue").
			if res.Done.Path == protocol.PathQueued {
				d.Path = protocol.PathQueued
			}
			d.FinishReason = cmp.Or(res.Done.FinishReason, "stop")
			d.Usage = res.Done.Usage
		}
		if s.emit(Event{Name: protocol.EventDone, Done: &d}) != nil {
			return OutcomeCancelled, true, nil
		}
		return OutcomeDone, true, nil
	case protocol.KindError:
		return s.end(res.Problem), true, nil
	}
	return "", false, nil
}
