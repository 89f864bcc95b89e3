package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/streamlog"
)

// deleteTimeout bounds deleting the dead letters a batch replayed.
const deleteTimeout = 10 * time.Second

// Why a dead letter cannot be replayed.
var (
	errNoPayload   = errors.New("its job was not kept (only a digest and size)")
	errUndecodable = errors.New("its job does not decode")
)

// replayable returns the job a record would replay.
func replayable(r failover.DeadLetter) (protocol.Job, error) {
	if len(r.Body) == 0 {
		return protocol.Job{}, errNoPayload
	}
	j, err := protocol.DecodeJob(r.Body)
	if err != nil {
		return protocol.Job{}, fmt.Errorf("%w: %w", errUndecodable, err)
	}
	return j, nil
}

// replay enqueues dead letters again, in batches, and reports each answer.
func (t *Tool) replay(ctx context.Context, args []string) int {
	fs := t.flags("replay")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	detach := fs.Bool("detach", false, `print "<dead letter id> <new request id>" per replay instead of the answers`)
	all := fs.Bool("all", false, "replay every dead letter there is when the command starts")
	batch := fs.Int("batch", MaxBatch, fmt.Sprintf("jobs enqueued at a time, 1 to %d", MaxBatch))
	ids, ok := parse(fs, args)
	if !ok {
		return ExitUsage
	}
	switch {
	case *all && len(ids) > 0:
		return t.failf(ExitUsage, "replay takes -all or dead-letter ids, not both")
	case !*all && len(ids) == 0:
		return t.failf(ExitUsage, "replay needs dead-letter ids, or -all")
	case *batch < 1 || *batch > MaxBatch:
		return t.failf(ExitUsage, "-batch %d is not between 1 and %d", *batch, MaxBatch)
	}
	targets, skipped, code := t.replayTargets(ctx, ids, *all)
	if code != ExitOK {
		return code
	}
	if len(targets) == 0 {
		fmt.Fprintf(t.deps.Stderr, "nothing to replay (%d dead letters cannot be replayed)\n", skipped)
		if skipped > 0 {
			return ExitNotReplayable
		}
		return ExitOK
	}
	if !*yes {
		q := fmt.Sprintf("Replay %d dead letters as new requests (%d at a time)?", len(targets), *batch)
		if skipped > 0 {
			q = fmt.Sprintf("Replay %d dead letters as new requests (%d at a time; %d cannot be replayed and stay)?", len(targets), *batch, skipped)
		}
		if !t.confirm(q) {
			return t.failf(ExitAborted, "not confirmed; nothing replayed")
		}
	}
	var sum replaySummary
	for start := 0; start < len(targets); start += *batch {
		chunk := targets[start:min(start+*batch, len(targets))]
		if code := t.checkBacklog(ctx, len(chunk)); code != ExitOK {
			sum.notStarted = len(targets) - start
			break
		}
		t.runBatch(ctx, chunk, start, len(targets), *detach, &sum)
		if ctx.Err() != nil {
			sum.notStarted = len(targets) - start - len(chunk)
			break
		}
	}
	if *detach && sum.done+sum.failed > 0 && t.deps.Log != nil {
		fmt.Fprintf(t.deps.Stderr, "the answers stay in their stream logs for %s: GET /v1/streams/{new request id} as the original caller\n", t.cfg.StreamLogTTL)
	}
	return t.summarize(sum, skipped)
}

// replayTarget is a dead letter to replay: the record itself when it was
// named, only its id with -all (records are read again batch by batch, so
// thousands of jobs are not held in memory).
type replayTarget struct {
	id  string
	rec *failover.DeadLetter
}

// replayTargets finds what to replay. Named ids must all exist and be
// replayable, else nothing is done; with -all, what cannot be replayed is
// counted in skipped and left alone.
func (t *Tool) replayTargets(ctx context.Context, ids []string, all bool) ([]replayTarget, int, int) {
	var targets []replayTarget
	if !all {
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			if seen[id] {
				continue
			}
			seen[id] = true
			r, err := t.deps.Store.DeadLetterByID(ctx, id)
			if errors.Is(err, failover.ErrDeadLetterNotFound) {
				return nil, 0, t.failf(ExitNotFound, "no dead letter %q; nothing replayed", id)
			}
			if err != nil {
				return nil, 0, t.backendErr("read dead letter "+id, err)
			}
			if _, err := replayable(r); err != nil {
				return nil, 0, t.failf(ExitNotReplayable, "dead letter %s cannot be replayed: %v (%s); nothing replayed", id, err, t.redactedHint())
			}
			targets = append(targets, replayTarget{id: id, rec: &r})
		}
		return targets, 0, ExitOK
	}
	skipped := 0
	for cursor := ""; ; {
		recs, next, err := t.deps.Store.DeadLetterPage(ctx, cursor, listPage)
		if err != nil {
			return nil, 0, t.backendErr("read dead letters", err)
		}
		for _, r := range recs {
			if _, err := replayable(r); err != nil {
				skipped++
				continue
			}
			targets = append(targets, replayTarget{id: r.ID})
		}
		if next == "" {
			return targets, skipped, ExitOK
		}
		cursor = next
	}
}

// checkBacklog refuses to start a batch of n that would take the queue
// over QUEUE_OVERFLOW_THRESHOLD: the api would then answer its own users
// 503, for the sake of old jobs.
func (t *Tool) checkBacklog(ctx context.Context, n int) int {
	if t.deps.Depth == nil || t.cfg.OverflowThreshold <= 0 {
		return ExitOK
	}
	depth, err := t.deps.Depth.Depth(ctx)
	if err != nil {
		return t.backendErr("read the queue's backlog", err)
	}
	if depth+int64(n) > t.cfg.OverflowThreshold {
		return t.failf(ExitFailed, "the queue holds %d jobs; %d more would pass QUEUE_OVERFLOW_THRESHOLD (%d): stopped, try again later",
			depth, n, t.cfg.OverflowThreshold)
	}
	return ExitOK
}

// replaySummary counts what a replay command did.
type replaySummary struct {
	done, failed, notEnqueued, interrupted, gone, notStarted int
	deleted                                                  int64
	kept                                                     int // done, but its dead letter could not be deleted
}

// outcome of one replay.
type outcome int

const (
	outcomeDone        outcome = iota + 1
	outcomeError               // the stream ended in error
	outcomeInterrupted         // the command was stopped first
)

// run is one dead letter being replayed: its relay, and what it produced
// so far for the printer.
type run struct {
	rec   failover.DeadLetter
	newID string
	relay failover.Relay

	mu      sync.Mutex
	out     []string      // rendered pieces not printed yet
	changed chan struct{} // signalled when out grew or the run ended
	ended   bool
	outcome outcome
	problem *protocol.Problem
	lastID  int64 // stream log event ids, 1, 2, 3, … as the api numbers them
}

// runBatch replays one batch: every job is subscribed and enqueued first,
// then the answers are printed one after the other while all are
// collected at once (a relay must be read, or it ends as a slow reader).
func (t *Tool) runBatch(ctx context.Context, batch []replayTarget, offset, total int, detach bool, sum *replaySummary) {
	var runs []*run
	for i, tg := range batch {
		rec := tg.rec
		if rec == nil {
			r, err := t.deps.Store.DeadLetterByID(ctx, tg.id)
			if errors.Is(err, failover.ErrDeadLetterNotFound) {
				// Replayed or purged by someone else since the start, or
				// expired.
				fmt.Fprintf(t.deps.Stderr, "[%d/%d] dead letter %s is gone; skipped\n", offset+i+1, total, tg.id)
				sum.gone++
				continue
			}
			if err != nil {
				fmt.Fprintf(t.deps.Stderr, "[%d/%d] dead letter %s not read: %v\n", offset+i+1, total, tg.id, err)
				sum.notEnqueued++
				continue
			}
			rec = &r
		}
		job, err := replayable(*rec)
		if err != nil {
			fmt.Fprintf(t.deps.Stderr, "[%d/%d] dead letter %s cannot be replayed: %v; skipped\n", offset+i+1, total, tg.id, err)
			sum.gone++
			continue
		}
		r, err := t.start(ctx, *rec, job)
		if err != nil {
			fmt.Fprintf(t.deps.Stderr, "[%d/%d] dead letter %s not enqueued: %v\n", offset+i+1, total, tg.id, err)
			sum.notEnqueued++
			continue
		}
		if detach {
			fmt.Fprintf(t.deps.Stdout, "%s %s\n", r.rec.ID, r.newID)
		}
		runs = append(runs, r)
	}
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() { t.pump(ctx, r) })
	}
	if !detach {
		for i, r := range runs {
			t.print(r, offset+i+1, total)
		}
	}
	wg.Wait()
	var done []string
	for _, r := range runs {
		switch r.outcome {
		case outcomeDone:
			sum.done++
			done = append(done, r.rec.ID)
		case outcomeError:
			sum.failed++
			if detach {
				fmt.Fprintf(t.deps.Stderr, "%s %s ended in error: %s\n", r.rec.ID, r.newID, problemText(r.problem))
			}
		default:
			sum.interrupted++
		}
	}
	t.deleteReplayed(ctx, done, sum)
}

// start subscribes to a new request's results and enqueues the job under
// it.
func (t *Tool) start(ctx context.Context, rec failover.DeadLetter, job protocol.Job) (*run, error) {
	job.RequestID = uuid.NewString()
	job.Trace, job.TraceDropped = nil, false
	// If the replay fails too, its dead letter replaces this one (on Redis
	// Streams), so the prompt is never dead-lettered twice.
	job.ReplayOf = rec.ID
	relay, err := t.deps.Spiller.Spill(ctx, job)
	if err != nil {
		var p *protocol.Problem
		if errors.As(err, &p) {
			return nil, errors.New(problemText(p))
		}
		return nil, err
	}
	r := &run{rec: rec, newID: job.RequestID, relay: relay, changed: make(chan struct{}, 1)}
	if t.deps.Log != nil && job.UserID != "" {
		// The original caller can read the answer back, as with any
		// stream of theirs (GET /v1/streams/{id}).
		t.deps.Log.Open(r.newID, job.UserID)
	}
	return r, nil
}

// pump reads one relay to its end: a terminal result, the relay giving
// up, or ctx ending (then the job is cancelled).
func (t *Tool) pump(ctx context.Context, r *run) {
	completed := false
	defer func() { r.relay.Close(completed) }()
	for {
		select {
		case res, ok := <-r.relay.Results():
			if !ok { // a source that ends without a terminal result failed
				r.add(t, protocol.Result{Kind: protocol.KindError, Problem: protocol.StreamFailed()}, outcomeError)
				return
			}
			switch res.Kind {
			case protocol.KindHeartbeat:
				continue
			case protocol.KindDone:
				completed = true
				r.add(t, res, outcomeDone)
				return
			case protocol.KindError:
				completed = true
				r.add(t, res, outcomeError)
				return
			}
			r.add(t, res, 0)
		case <-r.relay.Done():
			r.add(t, protocol.Result{Kind: protocol.KindError, Problem: r.relay.Problem()}, outcomeError)
			return
		case <-ctx.Done():
			r.add(t, protocol.Result{Kind: protocol.KindError,
				Problem: protocol.Stopped("The replay was interrupted; the job was cancelled.")}, outcomeInterrupted)
			return
		}
	}
}

// add logs res, renders it for the printer, and ends the run when end is
// set.
func (r *run) add(t *Tool, res protocol.Result, end outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch res.Kind {
	case protocol.KindBatch:
		var b strings.Builder
		for _, c := range res.Chunks {
			r.log(t, "", map[string]string{"content": c.Content})
			b.WriteString(clean(c.Content))
		}
		r.out = append(r.out, b.String())
	case protocol.KindReset:
		reset := cmp.Or(res.Reset, &protocol.Reset{})
		r.log(t, protocol.EventReset, reset)
		r.out = append(r.out, fmt.Sprintf("\n[reset: attempt %d; the answer starts again]\n", reset.Attempt))
	case protocol.KindRetrying:
		if res.Retrying != nil {
			r.log(t, protocol.EventRetrying, res.Retrying)
			r.out = append(r.out, fmt.Sprintf("[retrying: attempt %d in %.1fs (%s)]\n", res.Retrying.Attempt, res.Retrying.RetryInSeconds, clean(res.Retrying.Reason)))
		}
	case protocol.KindDone:
		d := protocol.Done{RequestID: r.newID, Path: protocol.PathQueued, FinishReason: "stop"}
		if res.Done != nil {
			d.FinishReason = cmp.Or(res.Done.FinishReason, "stop")
			d.Usage = res.Done.Usage
		}
		r.log(t, protocol.EventDone, d)
		line := fmt.Sprintf("\n== done: request %s, finish reason %s", r.newID, clean(d.FinishReason))
		if d.Usage != nil {
			line += fmt.Sprintf(", %d completion tokens", d.Usage.CompletionTokens)
		}
		r.out = append(r.out, line+"\n")
	case protocol.KindError:
		p := cmp.Or(res.Problem, protocol.StreamFailed())
		r.problem = p
		r.log(t, protocol.EventError, p)
		r.out = append(r.out, fmt.Sprintf("\n== error: request %s: %s\n", r.newID, problemText(p)))
	}
	if end != 0 {
		r.ended, r.outcome = true, end
	}
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// log appends one event to the run's stream log, numbered as the api
// numbers a stream's events. The caller holds r.mu.
func (r *run) log(t *Tool, name string, v any) {
	if t.deps.Log == nil {
		return
	}
	data, err := json.Marshal(v)
	if err != nil {
		return // our own types of strings and numbers: cannot happen
	}
	r.lastID++
	t.deps.Log.Append(r.newID, streamlog.Event{ID: r.lastID, Name: name, Data: data})
}

// print writes one run's answer as it arrives, between a header and the
// end line.
func (t *Tool) print(r *run, n, total int) {
	w := t.deps.Stdout
	fmt.Fprintf(w, "== replay %d/%d: dead letter %s (request %s) as request %s\n", n, total, clean(r.rec.ID), clean(r.rec.RequestID), r.newID)
	for {
		<-r.changed
		r.mu.Lock()
		out, ended := r.out, r.ended
		r.out = nil
		r.mu.Unlock()
		for _, s := range out {
			fmt.Fprint(w, s)
		}
		if ended {
			return
		}
	}
}

// deleteReplayed deletes the dead letters whose replay ended in done,
// where the backend can delete single records.
func (t *Tool) deleteReplayed(ctx context.Context, ids []string, sum *replaySummary) {
	if len(ids) == 0 {
		return
	}
	del, ok := t.deps.Store.(Deleter)
	if !ok {
		sum.kept += len(ids)
		return
	}
	// A stopped command still deletes what was answered: a replay that
	// ended in done must not run again.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	n, err := del.DeleteDeadLetters(dctx, ids...)
	if err != nil {
		fmt.Fprintf(t.deps.Stderr, "spillway-admin: delete %d replayed dead letters: %v (they stay; do not replay them again)\n", len(ids), err)
		sum.kept += len(ids)
		return
	}
	sum.deleted += n
}

// summarize prints what the command did and returns its exit status.
func (t *Tool) summarize(s replaySummary, skipped int) int {
	w := t.deps.Stderr
	fmt.Fprintf(w, "replayed: %d done, %d ended in error, %d not enqueued", s.done, s.failed, s.notEnqueued)
	if s.interrupted > 0 {
		fmt.Fprintf(w, ", %d interrupted (cancelled)", s.interrupted)
	}
	if s.gone > 0 {
		fmt.Fprintf(w, ", %d gone meanwhile", s.gone)
	}
	if s.notStarted > 0 {
		fmt.Fprintf(w, ", %d not started", s.notStarted)
	}
	fmt.Fprintf(w, "; %d dead letters deleted", s.deleted)
	if skipped > 0 {
		fmt.Fprintf(w, "; %d cannot be replayed and stay", skipped)
	}
	fmt.Fprintln(w)
	if s.kept > 0 {
		if _, ok := t.deps.Store.(Deleter); !ok {
			fmt.Fprintf(w, "the %s dead-letter queue cannot delete single records: the %d replayed ones stay until their retention or purge -all\n", t.cfg.Backend, s.kept)
		}
	}
	if s.failed+s.notEnqueued+s.interrupted+s.notStarted > 0 {
		return ExitFailed
	}
	if skipped > 0 {
		return ExitNotReplayable
	}
	return ExitOK
}

// problemText is a problem in one line: its slug and detail.
func problemText(p *protocol.Problem) string {
	if p == nil {
		return "unknown error"
	}
	slug := strings.TrimPrefix(p.Type, protocol.ProblemTypeBase)
	return clean(oneLine(slug + ": " + p.Detail))
}
