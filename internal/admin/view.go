package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// maxListed bounds list -n.
const maxListed = 1_000_000

// maxRawShown bounds how much of a job that does not decode show prints.
const maxRawShown = 64 << 10

// list prints dead letters, oldest first.
func (t *Tool) list(ctx context.Context, args []string) int {
	fs := t.flags("list")
	n := fs.Int("n", 100, "how many dead letters to list, oldest first")
	after := fs.String("after", "", "list those after this cursor (printed by a previous list)")
	asJSON := fs.Bool("json", false, "one JSON object per line instead of a table")
	pos, ok := parse(fs, args)
	if !ok {
		return ExitUsage
	}
	if len(pos) > 0 {
		return t.failf(ExitUsage, "list takes no arguments (got %q)", pos)
	}
	if *n < 1 || *n > maxListed {
		return t.failf(ExitUsage, "-n %d is not between 1 and %d", *n, maxListed)
	}
	depth, err := t.deps.Store.DeadLetterDepth(ctx)
	if err != nil {
		return t.backendErr("count dead letters", err)
	}
	fmt.Fprintf(t.deps.Stderr, "%d dead letters (%s)\n", depth, t.cfg.Backend)
	var tw *tabwriter.Writer
	if !*asJSON {
		tw = tabwriter.NewWriter(t.deps.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tFAILED AT (UTC)\tREQUEST ID\tATTEMPT\tJOB\tREASON")
	}
	cursor, listed := *after, 0
	for listed < *n {
		recs, next, err := t.deps.Store.DeadLetterPage(ctx, cursor, min(listPage, *n-listed))
		if err != nil {
			return t.backendErr("read dead letters", err)
		}
		for _, r := range recs {
			if *asJSON {
				if err := writeJSON(t.deps.Stdout, recordJSON(r, false)); err != nil {
					return t.backendErr("write", err)
				}
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", clean(r.ID), stamp(r.FailedAt), clean(r.RequestID), r.Attempt,
				jobSummary(r), clip(clean(oneLine(r.Reason)), 80))
		}
		listed += len(recs)
		cursor = next
		if next == "" {
			break
		}
	}
	if tw != nil {
		_ = tw.Flush()
	}
	if cursor != "" {
		fmt.Fprintf(t.deps.Stderr, "more: spillway-admin list -after '%s'\n", cursor)
	}
	return ExitOK
}

// show prints one dead letter.
func (t *Tool) show(ctx context.Context, args []string) int {
	fs := t.flags("show")
	asJSON := fs.Bool("json", false, "print the record as one JSON object")
	pos, ok := parse(fs, args)
	if !ok {
		return ExitUsage
	}
	if len(pos) != 1 {
		return t.failf(ExitUsage, "show takes one dead-letter id (got %d)", len(pos))
	}
	r, err := t.deps.Store.DeadLetterByID(ctx, pos[0])
	if errors.Is(err, failover.ErrDeadLetterNotFound) {
		return t.failf(ExitNotFound, "no dead letter %q", pos[0])
	}
	if err != nil {
		return t.backendErr("read dead letter", err)
	}
	if *asJSON {
		if err := writeJSON(t.deps.Stdout, recordJSON(r, true)); err != nil {
			return t.backendErr("write", err)
		}
		return ExitOK
	}
	w := t.deps.Stdout
	fmt.Fprintf(w, "id:          %s\n", clean(r.ID))
	fmt.Fprintf(w, "request id:  %s\n", clean(r.RequestID))
	fmt.Fprintf(w, "failed at:   %s\n", stamp(r.FailedAt))
	fmt.Fprintf(w, "attempt:     %d\n", r.Attempt)
	fmt.Fprintf(w, "replays:     %d failed\n", r.Replays)
	fmt.Fprintf(w, "reason:      %s\n", clean(r.Reason))
	fmt.Fprintf(w, "source:      %s\n", clean(r.Source))
	fmt.Fprintf(w, "job:         %d bytes, sha1 %s\n", r.BodyBytes, clean(r.BodySHA1))
	if len(r.Body) == 0 {
		fmt.Fprintf(w, "prompt:      not kept (%s)\n", t.redactedHint())
		return ExitOK
	}
	job, err := protocol.DecodeJob(r.Body)
	if err != nil {
		fmt.Fprintf(w, "prompt:      the job does not decode (%v); as stored:\n", err)
		raw := r.Body[:min(len(r.Body), maxRawShown)]
		fmt.Fprintf(w, "%s\n", clean(string(raw)))
		if len(r.Body) > maxRawShown {
			fmt.Fprintf(w, "[%d more bytes not shown]\n", len(r.Body)-maxRawShown)
		}
		return ExitOK
	}
	writeJob(w, job)
	return ExitOK
}

// redactedHint explains a dead letter without its job.
func (t *Tool) redactedHint() string {
	if t.cfg.KeepPayload {
		return "DEAD_LETTER_KEEP_PAYLOAD was false when it failed; only the digest and size were stored"
	}
	return "DEAD_LETTER_KEEP_PAYLOAD=false: only the digest and size are stored"
}

// writeJob prints what a decoded job asked for.
func writeJob(w io.Writer, j protocol.Job) {
	fmt.Fprintf(w, "user:        %s\n", clean(j.UserID))
	if j.Priority != "" {
		fmt.Fprintf(w, "priority:    %s\n", clean(string(j.Priority)))
	}
	if j.ThreadID != "" {
		fmt.Fprintf(w, "thread:      %s\n", clean(j.ThreadID))
	}
	fmt.Fprintf(w, "enqueued at: %s\n", stamp(j.EnqueueTime))
	p := j.Payload
	if p.Model != "" {
		fmt.Fprintf(w, "model:       %s\n", clean(p.Model))
	}
	if p.MaxTokens != 0 {
		fmt.Fprintf(w, "max tokens:  %d\n", p.MaxTokens)
	}
	if p.Temperature != nil {
		fmt.Fprintf(w, "temperature: %g\n", *p.Temperature)
	}
	fmt.Fprintf(w, "messages:    %d\n", len(p.Messages))
	for _, m := range p.Messages {
		fmt.Fprintf(w, "--- %s\n%s\n", clean(m.Role), clean(m.Content))
	}
}

// recordJSON is a record as list -json and show -json print it. The job is
// included (withJob) as JSON when it is JSON, else as a string.
func recordJSON(r failover.DeadLetter, withJob bool) map[string]any {
	out := map[string]any{
		"id": r.ID, "request_id": r.RequestID, "reason": r.Reason, "attempt": r.Attempt, "replays": r.Replays,
		"failed_at": r.FailedAt.UTC().Format(time.RFC3339Nano), "source": r.Source,
		"job_bytes": r.BodyBytes, "job_sha1": r.BodySHA1, "job_kept": len(r.Body) > 0,
	}
	if withJob && len(r.Body) > 0 {
		if json.Valid(r.Body) {
			out["job"] = json.RawMessage(r.Body)
		} else {
			out["job_raw"] = string(r.Body)
		}
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// jobSummary is the JOB column: its size and whether it was kept.
func jobSummary(r failover.DeadLetter) string {
	if len(r.Body) > 0 {
		return fmt.Sprintf("%d B kept", r.BodyBytes)
	}
	return fmt.Sprintf("%d B digest only", r.BodyBytes)
}

func stamp(at time.Time) string {
	if at.IsZero() {
		return "-"
	}
	return at.UTC().Format("2006-01-02 15:04:05.000")
}

// clean makes text from the queue (prompts, answers, reasons) safe to
// print on a terminal: line breaks and tabs stay, other control characters
// (which could move the cursor or retitle the window) and invalid UTF-8
// become U+FFFD.
func clean(s string) string {
	ok := true
	for _, r := range s {
		if r == utf8.RuneError || r != '\n' && r != '\t' && unicode.IsControl(r) {
			ok = false
			break
		}
	}
	if ok {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || r != '\n' && r != '\t' && unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, s)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
