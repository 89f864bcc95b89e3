package loadtest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
)

// WriteJSON writes r as one indented JSON document.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("loadtest: write json: %w", err)
	}
	return nil
}

// WriteTable writes r as tables for people.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	p("url\t%s\n", r.URL)
	p("elapsed\t%.2fs\n", r.Elapsed)
	p("rate\t%.1f streams/s\n", r.Rate)
	p("verified content\t%t\n", r.Verified)
	if r.Interrupted {
		p("interrupted\ttrue\n")
	}
	p("\n")
	p("OUTCOME\tCOUNT\tDETAIL\n")
	p("requests\t%d\t\n", r.Requests)
	p("done\t%d\t\n", r.Done)
	p("error\t%d\t\n", r.Errors)
	for _, t := range sortedKeys(r.ErrorsByType) {
		p("\t%d\t%s\n", r.ErrorsByType[t], t)
	}
	p("refused\t%d\t\n", r.Refused)
	for _, rf := range r.RefusedBy {
		ra := "no Retry-After"
		if rf.NoRetryAfter < rf.Count {
			ra = fmt.Sprintf("Retry-After %d-%ds", rf.RetryAfterMin, rf.RetryAfterMax)
			if rf.NoRetryAfter > 0 {
				ra += fmt.Sprintf(", %d without", rf.NoRetryAfter)
			}
		}
		p("\t%d\t%d %s (%s)\n", rf.Count, rf.Status, rf.Type, ra)
	}
	p("disconnected\t%d\t(on purpose)\n", r.Disconnected)
	p("aborted\t%d\t(run cancelled)\n", r.Aborted)
	p("lost\t%d\t\n", r.Lost)
	for _, reason := range sortedKeys(r.LostByReason) {
		p("\t%d\t%s\n", r.LostByReason[reason], reason)
	}
	p("pings\t%d\t\n", r.Pings)
	p("resets\t%d\t\n", r.Resets)
	for _, path := range sortedKeys(r.Paths) {
		p("path %s\t%d\t\n", path, r.Paths[path])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("loadtest: write table: %w", err)
	}

	if len(r.Latency) > 0 {
		fmt.Fprintln(w)
		p("PATH\tDONE\tFIRST p50\tp90\tp99\tmax\tTOTAL p50\tp90\tp99\tmax\n")
		for _, path := range sortedKeys(r.Latency) {
			l := r.Latency[path]
			f, t := l.FirstChunk, l.Total
			p("%s\t%d\t%.1fms\t%.1fms\t%.1fms\t%.1fms\t%.1fms\t%.1fms\t%.1fms\t%.1fms\n",
				path, l.Count, f.P50, f.P90, f.P99, f.Max, t.P50, t.P90, t.P99, t.Max)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("loadtest: write table: %w", err)
		}
	}
	if r.Pings > 0 || r.MaxGap.Max > 0 {
		fmt.Fprintln(w)
		p("SILENCE\tp50\tp90\tp99\tmax\n")
		for _, row := range []struct {
			name string
			v    Percentiles
		}{{"ping interval", r.PingInterval}, {"max gap per stream", r.MaxGap}} {
			p("%s\t%.1fms\t%.1fms\t%.1fms\t%.1fms\n", row.name, row.v.P50, row.v.P90, row.v.P99, row.v.Max)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("loadtest: write table: %w", err)
		}
	}
	if len(r.LostSamples) > 0 {
		fmt.Fprintln(w, "\nlost streams (first few):")
		for _, s := range r.LostSamples {
			fmt.Fprintf(w, "  %s\n", s)
		}
	}
	return nil
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	return slices.Sorted(maps.Keys(m))
}

func sortRefusals(rs []Refusal) {
	slices.SortFunc(rs, func(a, b Refusal) int {
		return cmp.Or(cmp.Compare(a.Status, b.Status), cmp.Compare(a.Type, b.Type))
	})
}
