package stream

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/telemetry"
)

// shuttingDownRetryAfter is the Retry-After, in seconds, of the
// shutting-down problem: another api process takes the retry at once.
const shuttingDownRetryAfter = 1

// session is one request's write loop: where it writes, what it relays,
// and from where.
type session struct {
	h         *Handler
	w         http.ResponseWriter
	open      opener // the dialect's writer of this answer; nil is /v1/stream's
	requestID string
	path      string // protocol.PathDirect or PathQueued
	start     time.Time
	frames    <-chan protocol.Result
	// relayDone, on the queued path, closes when the relay gave up;
	// relayProblem then says why.
	relayDone    <-chan struct{}
	relayProblem func() *protocol.Problem

	sw         eventWriter
	firstChunk bool
	// ctx is the request's, holding its server span; problemType is the
	// type of the problem the stream ended with, for the span's outcome.
	ctx         context.Context
	problemType string
}

// serve opens the SSE response, then relays frames until a terminal one,
// the client leaves, the relay gives up or the server drains. It returns
// the outcome, and whether the source itself finished (sent done or error).
func (s *session) serve(ctx context.Context) (string, bool) {
	s.ctx = ctx
	open := s.open
	if open == nil {
		open = openNative
	}
	s.sw = open(s.w, s.h.cfg.WriteTimeout)
	closed := s.h.m.StreamOpened(s.path)
	defer closed()
	outcome, finished := s.pump(ctx)
	s.h.m.StreamEnded(s.path, outcome)
	s.traceEnd(outcome)
	return outcome, finished
}

// fail ends the stream with p: outcome error, or cancelled when even the
// error event could not be written.
func (s *session) fail(p *protocol.Problem) string {
	s.problemType = p.Type
	if err := s.sw.Error(p); err != nil {
		return OutcomeCancelled
	}
	return OutcomeError
}

func (s *session) pump(ctx context.Context) (outcome string, finished bool) {
	h := s.h
	if err := s.sw.Start(s.requestID, s.path); err != nil {
		return OutcomeCancelled, false
	}
	heartbeat := time.NewTimer(h.cfg.Heartbeat)
	defer heartbeat.Stop()
	s.firstChunk = true
	for {
		var err error
		select {
		case res, ok := <-s.frames:
			if !ok {
				h.log.Error("stream source ended without a terminal event", "request_id", s.requestID, "path", s.path)
				return s.fail(protocol.StreamFailed()), false
			}
			if res.Kind == protocol.KindHeartbeat {
				continue // worker liveness only; the relay tracks it
			}
			var end bool
			if outcome, end, err = s.write(res); end {
				return outcome, true
			}
		case <-heartbeat.C:
			err = s.sw.Ping()
		case <-s.relayDone:
			return s.fail(s.relayProblem()), false
		case <-ctx.Done():
			return OutcomeCancelled, false
		case <-h.draining:
			return s.fail(protocol.ShuttingDown(shuttingDownRetryAfter)), false
		}
		if errors.Is(err, errAnswerEnded) {
			return OutcomeError, false
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				h.log.Warn("client too slow, stream cut", "request_id", s.requestID, "path", s.path)
			}
			return OutcomeCancelled, false
		}
		// Heartbeat on a timer reset after each write.
		if !heartbeat.Stop() {
			select {
			case <-heartbeat.C:
			default:
			}
		}
		heartbeat.Reset(h.cfg.Heartbeat)
	}
}

// write writes one frame. end reports a terminal frame, whose outcome is
// then final; err is a failed write to the client.
func (s *session) write(res protocol.Result) (outcome string, end bool, err error) {
	switch res.Kind {
	case protocol.KindBatch:
		if s.firstChunk {
			s.firstChunk = false
			s.firstChunkWritten()
		}
		for _, c := range res.Chunks {
			if err = s.sw.Chunk(c.Seq, c.Content); err != nil {
				break
			}
		}
		return "", false, err
	case protocol.KindReset:
		telemetry.Reset(trace.SpanFromContext(s.ctx), res.Reset.Attempt)
		return "", false, s.sw.Reset(*res.Reset)
	case protocol.KindRetrying:
		return "", false, s.sw.Retrying(*res.Retrying)
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
		if s.sw.Done(d) != nil {
			return OutcomeCancelled, true, nil
		}
		return OutcomeDone, true, nil
	case protocol.KindError:
		return s.fail(res.Problem), true, nil
	}
	return "", false, nil
}
