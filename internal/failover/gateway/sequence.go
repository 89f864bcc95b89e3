package gateway

import (
	"slices"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// maxHeld bounds the batches held back behind a gap; more means the gap
// will not heal (docs/QUEUE.md, "Fencing and gaps").
const maxHeld = 64

// sequencer is the relay's fence and gap check, without clocks or I/O: it
// follows the newest attempt, drops messages of older ones and duplicates,
// and holds back what arrives after a missing chunk until the gap heals.
// A `done` passes only once every chunk it counts has passed.
type sequencer struct {
	attempt int // attempt followed; 0 before the first fenced message
	next    int // seq the client needs next
	held    []protocol.Result
	out     []protocol.Result // the last verdict's out, reused
	// stale counts messages dropped because an older attempt wrote them;
	// dups batches dropped because every chunk of theirs had passed.
	stale, dups int
}

// verdict is what one message did to the sequence.
type verdict struct {
	// out are the results to pass to the client, in order.
	out []protocol.Result
	// waiting reports a gap open: results are held until it heals.
	waiting bool
	// broken reports a gap that cannot heal: the stream must end.
	broken bool
	// stale reports the message came from an older attempt and was dropped.
	stale bool
	// dups counts batches dropped as duplicates while handling the message.
	dups int
}

func newSequencer() *sequencer { return &sequencer{next: 1} }

// accept takes one decoded message and says what to forward.
func (s *sequencer) accept(r protocol.Result) verdict {
	dups := s.dups
	v := s.take(r)
	v.dups = s.dups - dups
	return v
}

func (s *sequencer) take(r protocol.Result) verdict {
	att := r.Attempt
	if att == 0 { // unfenced: an earlier worker; it speaks for the attempt followed
		att = s.attempt
	}
	// The verdict's results are sent on before the next accept: one
	// buffer serves every message.
	out := s.out[:0]
	defer func() { s.out = out[:0] }()
	switch {
	case att < s.attempt:
		s.stale++
		return verdict{stale: true, waiting: len(s.held) > 0}
	case att > s.attempt:
		// A newer attempt took the job over: what the client has is void.
		// Heartbeat or reset, whichever comes first, moves the fence; the
		// client hears one reset, and only if it had chunks.
		if s.next > 1 {
			out = append(out, protocol.Result{Kind: protocol.KindReset, Attempt: att, Reset: &protocol.Reset{Attempt: att}})
		}
		s.attempt, s.next, s.held = att, 1, nil
		if r.Kind == protocol.KindReset {
			return verdict{out: out}
		}
	}
	switch r.Kind {
	case protocol.KindHeartbeat, protocol.KindRetrying:
		out = append(out, r)
	case protocol.KindReset:
		// The same attempt restarts its answer after a publish it could
		// not make good: void what the client has, if anything.
		if s.next > 1 || len(s.held) > 0 {
			out = append(out, r)
		}
		s.next, s.held = 1, nil
	case protocol.KindError:
		// An explicit error ends the stream whatever is missing.
		s.held = nil
		out = append(out, r)
	case protocol.KindBatch, protocol.KindDone:
		s.hold(r)
		var broken bool
		out, broken = s.release(out)
		if broken {
			return verdict{out: out, broken: true}
		}
	}
	return verdict{out: out, waiting: len(s.held) > 0, broken: len(s.held) > maxHeld}
}

// hold queues a batch or done in sequence order: a done after every batch.
func (s *sequencer) hold(r protocol.Result) {
	key := func(r protocol.Result) int {
		if r.Kind == protocol.KindDone {
			return int(^uint(0) >> 1)
		}
		return r.Chunks[0].Seq
	}
	i, _ := slices.BinarySearchFunc(s.held, key(r), func(h protocol.Result, k int) int { return key(h) - k })
	s.held = slices.Insert(s.held, i, r)
}

// release appends to out every held result that now follows without a
// gap. broken reports a done counting other than what passed.
func (s *sequencer) release(out []protocol.Result) ([]protocol.Result, bool) {
	for len(s.held) > 0 {
		h := s.held[0]
		if h.Kind == protocol.KindDone {
			if h.Attempt == 0 { // unfenced: no count to check
				s.held = slices.Delete(s.held, 0, 1) // in place: the buffer is kept
				return append(out, h), false
			}
			switch got := s.next - 1; {
			case got == h.Count:
				s.held = slices.Delete(s.held, 0, 1) // in place: the buffer is kept
				return append(out, h), false
			case got > h.Count:
				return out, true // more chunks than the worker counted
			}
			return out, false // chunks missing: wait for them
		}
		last := h.Chunks[len(h.Chunks)-1].Seq
		if last < s.next { // a duplicate (a publish retried after a lost reply)
			s.held = slices.Delete(s.held, 0, 1) // in place: the buffer is kept
			s.dups++
			continue
		}
		first := h.Chunks[0].Seq
		if first > s.next {
			return out, false // a gap: wait
		}
		s.held = slices.Delete(s.held, 0, 1) // in place: the buffer is kept
		h.Chunks = h.Chunks[s.next-first:]
		s.next = last + 1
		out = append(out, h)
	}
	return out, false
}
