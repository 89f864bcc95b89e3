package stream

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/streamlog"
)

// Resume and stop (docs/API.md, "Resume and stop"): GET /v1/streams/{id}
// replays a stream's log after Last-Event-ID and tails it live, on any api
// process; DELETE stops the stream wherever it runs.

const (
	// tailBlock is how long one read of the log waits for new events; the
	// reader's lease and the log's existence are checked between reads.
	tailBlock = time.Second
	// readerLeaseMin is the shortest lease a resumed reader holds, so two
	// refreshes a tailBlock apart always overlap.
	readerLeaseMin = 3 * tailBlock
	// stopTimeout bounds telling other processes about a stop.
	stopTimeout = 2 * time.Second
	// maxRequestIDLen bounds the id in a /v1/streams path.
	maxRequestIDLen = 128
	// ownerGrace is how long a log not found yet is looked for again: the
	// api running a stream that started a moment ago may not have flushed
	// its log's first entry (streamlog.DefaultFlushInterval, longer under
	// load), yet its client already has the id. ownerPoll spaces the looks.
	ownerGrace = 250 * time.Millisecond
	ownerPoll  = 10 * time.Millisecond
)

// register records a stream of this process so a stop can reach it; stop
// closes when it should stop. unregister(requestID, stop) must be called
// when it ends.
func (h *Handler) register(requestID string) (stop <-chan struct{}) {
	c := make(chan struct{})
	h.liveMu.Lock()
	h.live.Set(requestID, c)
	h.liveMu.Unlock()
	return c
}

// unregister forgets the stream register recorded, unless another took its
// place.
func (h *Handler) unregister(requestID string, stop <-chan struct{}) {
	h.liveMu.Lock()
	if c, ok := h.live.Get(requestID); ok && c == stop {
		h.live.Delete(requestID)
	}
	h.liveMu.Unlock()
}

// StopLocal stops requestID's stream when this process runs it and
// reports whether it did.
func (h *Handler) StopLocal(requestID string) bool {
	h.liveMu.Lock()
	defer h.liveMu.Unlock()
	c, ok := h.live.Get(requestID)
	if ok {
		h.live.Delete(requestID)
		close(c)
	}
	return ok
}

// WatchStops stops the local streams named on cancels (the announcements
// of failover.Canceller, which DELETE on another process makes) until
// cancels closes. The caller owns the goroutine and closes cancels.
func (h *Handler) WatchStops(cancels failover.CancelStream) {
	for id := range cancels.C() {
		h.StopLocal(id)
	}
}

// validStreamID accepts what the api hands out as request ids, and
// nothing that could build another key.
func validStreamID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
			return false
		}
	}
	return true
}

// owned checks that requestID's stream exists and belongs to the caller;
// otherwise it answers the refusal (404 for another identity, so ids of
// others' streams cannot be probed) and returns false.
func (h *Handler) owned(w http.ResponseWriter, r *http.Request, requestID string) bool {
	instance := r.URL.Path
	id, prob := h.identity(r)
	if prob != nil {
		WriteProblem(w, prob, instance)
		return false
	}
	if h.logr == nil || !validStreamID(requestID) {
		WriteProblem(w, protocol.NotFound(), instance)
		return false
	}
	owner, err := h.findOwner(r.Context(), requestID)
	if errors.Is(err, streamlog.ErrNotFound) || err == nil && owner != id.Name {
		WriteProblem(w, protocol.NotFound(), instance)
		return false
	}
	if err != nil {
		h.log.Warn("stream log unreachable", "request_id", requestID, "err", err)
		WriteProblem(w, protocol.NotReady(1), instance)
		return false
	}
	return true
}

// findOwner returns the identity that started requestID's stream, looking
// again for ownerGrace while the log is not found.
func (h *Handler) findOwner(ctx context.Context, requestID string) (string, error) {
	deadline := time.Now().Add(ownerGrace)
	for {
		owner, err := h.logr.Owner(ctx, requestID)
		if !errors.Is(err, streamlog.ErrNotFound) || !time.Now().Before(deadline) {
			return owner, err
		}
		t := time.NewTimer(ownerPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return owner, err
		}
	}
}

// lastEventID reads Last-Event-ID (header, else ?last_event_id=); none
// means from the start.
func lastEventID(r *http.Request) (int64, bool) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n >= 0
}

// Resume serves GET /v1/streams/{id}: the events after Last-Event-ID from
// the log, then the live ones until the terminal event.
func (h *Handler) Resume(w http.ResponseWriter, r *http.Request, requestID string) {
	h.wg.Add(1)
	defer h.wg.Done()
	after, ok := lastEventID(r)
	if !ok {
		WriteProblem(w, protocol.BadRequest("Last-Event-ID must be a non-negative integer."), r.URL.Path)
		return
	}
	if !h.owned(w, r, requestID) {
		return
	}
	ctx := r.Context()
	lease := max(h.cfg.ResumeWindow, readerLeaseMin)
	attach := func() {
		if err := h.logr.Attach(ctx, requestID, lease); err != nil && ctx.Err() == nil {
			h.log.Warn("could not mark a resumed stream as read", "request_id", requestID, "err", err)
		}
	}
	attach()
	sw := NewWriter(w, h.cfg.WriteTimeout)
	if err := sw.Start(requestID, ""); err != nil {
		return
	}
	h.tail(ctx, sw, requestID, after, attach)
}

// tail writes the log's events after after to sw until the terminal one.
func (h *Handler) tail(ctx context.Context, sw *Writer, requestID string, after int64, attach func()) {
	var cur streamlog.Cursor
	last := after
	lastWrite, lastAttach := time.Now(), time.Now()
	for {
		select {
		case <-h.draining:
			_ = sw.Event(errorEvent(last+1, protocol.ShuttingDown(shuttingDownRetryAfter)))
			return
		default:
		}
		evs, next, err := h.logr.Read(ctx, requestID, cur, tailBlock)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			h.log.Warn("stream log read failed", "request_id", requestID, "err", err)
			_ = sw.Event(errorEvent(last+1, protocol.StreamExpired()))
			return
		}
		cur = next
		for _, ev := range evs {
			if ev.ID <= last {
				if ev.ID <= after && (ev.Name == protocol.EventDone || ev.Name == protocol.EventError) {
					return // the client saw the end already
				}
				continue
			}
			if ev.ID != last+1 {
				// An entry the appender had to drop: the answer cannot
				// be given whole from here.
				h.log.Warn("gap in stream log", "request_id", requestID, "after", last, "id", ev.ID)
				_ = sw.Event(errorEvent(last+1, protocol.StreamExpired()))
				return
			}
			se := Event{ID: ev.ID, Name: ev.Name, Data: ev.Data}
			if err := sw.Event(se); err != nil {
				return
			}
			last, lastWrite = ev.ID, time.Now()
			if se.Terminal() {
				return
			}
		}
		if time.Since(lastAttach) >= tailBlock {
			attach()
			lastAttach = time.Now()
		}
		if len(evs) == 0 {
			// The log expired, or its producer died (docs/API.md,
			// "Resume and stop"): nothing more will come, but what it
			// wrote just before it stopped.
			if ok, err := h.logr.Live(ctx, requestID); err == nil && !ok {
				if more, _, err := h.logr.Read(ctx, requestID, cur, 0); err == nil && len(more) > 0 {
					continue
				}
				_ = sw.Event(errorEvent(last+1, protocol.StreamExpired()))
				return
			}
		}
		if time.Since(lastWrite) >= h.cfg.Heartbeat {
			if sw.Ping() != nil {
				return
			}
			lastWrite = time.Now()
		}
	}
}

// Stop serves DELETE /v1/streams/{id}: the stream ends at once with an
// `error` event of type stopped, its provider call is cancelled and its
// slot freed, wherever it runs.
func (h *Handler) Stop(w http.ResponseWriter, r *http.Request, requestID string) {
	if !h.owned(w, r, requestID) {
		return
	}
	if !h.StopLocal(requestID) && h.canceller != nil {
		// Another process runs it (its WatchStops hears this), or a
		// worker does: the same announcement reaches both.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), stopTimeout)
		defer cancel()
		ttl := max(h.cfg.LogTTL, time.Minute)
		if err := h.canceller.Cancel(ctx, requestID, ttl); err != nil {
			h.log.Warn("could not announce a stop", "request_id", requestID, "err", err)
			WriteProblem(w, protocol.NotReady(1), r.URL.Path)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}
