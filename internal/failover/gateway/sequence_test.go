package gateway

import (
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// render writes results as the client would see them: chunk contents,
// `[reset]`, `[done]`, `[error]`; heartbeats leave no trace.
func render(rs []protocol.Result) string {
	var b strings.Builder
	for _, r := range rs {
		switch r.Kind {
		case protocol.KindBatch:
			for _, c := range r.Chunks {
				b.WriteString(c.Content)
			}
		case protocol.KindReset:
			b.WriteString("[reset]")
		case protocol.KindDone:
			b.WriteString("[done]")
		case protocol.KindError:
			b.WriteString("[error]")
		case protocol.KindRetrying:
			b.WriteString("[retrying]")
		}
	}
	return b.String()
}

func TestSequencer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      []string
		want    string
		waiting bool
		broken  bool
		stale   int
	}{
		{"in order", []string{`SIGNAL:HEARTBEAT:1`, `BATCH:1:[{"seq":1,"content":"a"}]`, `BATCH:1:[{"seq":2,"content":"b"},{"seq":3,"content":"c"}]`, `SIGNAL:DONE:1:3`},
			"abc[done]", false, false, 0},
		{"unfenced worker", []string{`SIGNAL:HEARTBEAT`, `BATCH:[{"seq":1,"content":"a"}]`, `BATCH:[{"seq":2,"content":"b"}]`, `SIGNAL:DONE`},
			"ab[done]", false, false, 0},
		{"duplicate dropped", []string{`BATCH:1:[{"seq":1,"content":"a"},{"seq":2,"content":"b"}]`, `BATCH:1:[{"seq":1,"content":"a"},{"seq":2,"content":"b"}]`, `BATCH:1:[{"seq":2,"content":"b"},{"seq":3,"content":"c"}]`, `SIGNAL:DONE:1:3`},
			"abc[done]", false, false, 0},
		{"reordered batches heal", []string{`BATCH:1:[{"seq":1,"content":"a"}]`, `BATCH:1:[{"seq":3,"content":"c"}]`, `SIGNAL:DONE:1:3`, `BATCH:1:[{"seq":2,"content":"b"}]`},
			"abc[done]", false, false, 0},
		{"gap stays open", []string{`BATCH:1:[{"seq":1,"content":"a"}]`, `BATCH:1:[{"seq":3,"content":"c"}]`},
			"a", true, false, 0},
		{"done held while chunks missing", []string{`BATCH:1:[{"seq":1,"content":"a"}]`, `SIGNAL:DONE:1:2`},
			"a", true, false, 0},
		{"done counting fewer chunks than passed", []string{`BATCH:1:[{"seq":1,"content":"a"},{"seq":2,"content":"b"}]`, `SIGNAL:DONE:1:1`},
			"ab", false, true, 0},
		{"same-attempt reset heals a gap", []string{`BATCH:1:[{"seq":1,"content":"a"}]`, `BATCH:1:[{"seq":3,"content":"c"}]`, `SIGNAL:RESET:{"attempt":1}`, `BATCH:1:[{"seq":1,"content":"a"},{"seq":2,"content":"b"},{"seq":3,"content":"c"}]`, `SIGNAL:DONE:1:3`},
			"a[reset]abc[done]", false, false, 0},
		{"reset before any chunk is not forwarded", []string{`SIGNAL:HEARTBEAT:2`, `SIGNAL:RESET:{"attempt":2}`, `BATCH:2:[{"seq":1,"content":"x"}]`, `SIGNAL:DONE:2:1`},
			"x[done]", false, false, 0},
		{"takeover: one reset, old attempt fenced off", []string{
			`BATCH:1:[{"seq":1,"content":"a"}]`, `BATCH:1:[{"seq":2,"content":"b"}]`,
			`SIGNAL:HEARTBEAT:2`, `SIGNAL:RESET:{"attempt":2}`, `BATCH:2:[{"seq":1,"content":"x"}]`,
			`BATCH:1:[{"seq":3,"content":"c"}]`, `SIGNAL:DONE:1:3`, `SIGNAL:HEARTBEAT:1`,
			`BATCH:2:[{"seq":2,"content":"y"}]`, `SIGNAL:DONE:2:2`},
			"ab[reset]xy[done]", false, false, 3},
		{"newer attempt's batch before any reset", []string{`BATCH:1:[{"seq":1,"content":"a"}]`, `BATCH:3:[{"seq":1,"content":"x"}]`, `SIGNAL:DONE:3:1`},
			"a[reset]x[done]", false, false, 0},
		{"old error fenced off", []string{`BATCH:2:[{"seq":1,"content":"x"}]`, `SIGNAL:ERROR:1:{"type":"t","status":503}`, `SIGNAL:DONE:2:1`},
			"x[done]", false, false, 1},
		{"retrying of the attempt followed passes", []string{`SIGNAL:HEARTBEAT:1`, `SIGNAL:RETRYING:1:{"attempt":2,"retry_in_seconds":1,"reason":"throttled"}`,
			`BATCH:1:[{"seq":1,"content":"a"}]`, `SIGNAL:DONE:1:1`},
			"[retrying]a[done]", false, false, 0},
		{"old retrying fenced off", []string{`BATCH:2:[{"seq":1,"content":"x"}]`, `SIGNAL:RETRYING:1:{"attempt":2,"retry_in_seconds":1,"reason":"timeout"}`, `SIGNAL:DONE:2:1`},
			"x[done]", false, false, 1},
		{"newer attempt's retrying moves the fence", []string{`BATCH:1:[{"seq":1,"content":"a"}]`,
			`SIGNAL:RETRYING:2:{"attempt":2,"retry_in_seconds":1,"reason":"timeout"}`, `BATCH:1:[{"seq":2,"content":"b"}]`,
			`BATCH:2:[{"seq":1,"content":"x"}]`, `SIGNAL:DONE:2:1`},
			"a[reset][retrying]x[done]", false, false, 1},
		{"error ends whatever is missing", []string{`BATCH:1:[{"seq":1,"content":"a"}]`, `BATCH:1:[{"seq":3,"content":"c"}]`, `SIGNAL:ERROR:1:{"type":"t","status":503}`},
			"a[error]", false, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newSequencer()
			var out []protocol.Result
			var last verdict
			for _, m := range tt.in {
				r, err := protocol.DecodeResult([]byte(m))
				if err != nil {
					t.Fatalf("DecodeResult(%s): %v", m, err)
				}
				last = s.accept(r)
				out = append(out, last.out...)
				if last.broken {
					break
				}
			}
			if got := render(out); got != tt.want {
				t.Errorf("client saw %q, want %q", got, tt.want)
			}
			if last.waiting != tt.waiting || last.broken != tt.broken {
				t.Errorf("last verdict waiting=%v broken=%v, want %v %v", last.waiting, last.broken, tt.waiting, tt.broken)
			}
			if s.stale != tt.stale {
				t.Errorf("stale = %d, want %d", s.stale, tt.stale)
			}
		})
	}
}

func TestSequencerHoldsBounded(t *testing.T) {
	t.Parallel()
	s := newSequencer()
	var v verdict
	for i := range maxHeld + 1 {
		v = s.accept(protocol.Result{Kind: protocol.KindBatch, Attempt: 1, Chunks: []protocol.Chunk{{Seq: 3 + i, Content: "x"}}})
		if v.broken {
			break
		}
	}
	if !v.broken {
		t.Fatalf("%d batches held behind a gap without giving up", len(s.held))
	}
}

func TestSequencerCountsDuplicates(t *testing.T) {
	t.Parallel()
	s := newSequencer()
	var dups int
	for _, m := range []string{
		`BATCH:1:[{"seq":1,"content":"a"},{"seq":2,"content":"b"}]`,
		`BATCH:1:[{"seq":1,"content":"a"},{"seq":2,"content":"b"}]`, // whole batch again: a duplicate
		`BATCH:1:[{"seq":2,"content":"b"},{"seq":3,"content":"c"}]`, // overlaps: trimmed, not dropped
	} {
		r, err := protocol.DecodeResult([]byte(m))
		if err != nil {
			t.Fatal(err)
		}
		dups += s.accept(r).dups
	}
	if dups != 1 || s.next != 4 {
		t.Fatalf("dups %d next %d, want 1 duplicate and seq 4 next", dups, s.next)
	}
}
