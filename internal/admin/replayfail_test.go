package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/admin"
	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// failingConsumer runs a worker whose upstream answers every call 500,
// until the returned stop is called.
func (r *rig) failingConsumer() (stop func()) {
	r.t.Helper()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"down"}}`, http.StatusInternalServerError)
	}))
	cfg := r.config(map[string]string{"LLM_BASE_URL": down.URL + "/v1"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunConsumer(ctx, cfg, testutil.DiscardLogger()) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			r.t.Error("failing consumer did not stop within 30s")
		}
		down.Close()
	}
	r.t.Cleanup(stop)
	return stop
}

// records lists the dead letters' ids, sorted.
func (r *rig) records() []string {
	r.t.Helper()
	dls, err := r.queue(true).DeadLetters(context.Background(), 1<<20)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, d := range dls {
		out = append(out, d.ID)
	}
	sort.Strings(out)
	return out
}

// A replay while the provider still fails does not add dead letters
// (issue 29: 3 → 6 → 8 → 11 before): each failed replay's record replaces
// the one it replayed, counting the replays, and the replay once the
// provider is back runs each prompt once and deletes each record once; on
// one stream and on a sharded queue, where a replay may land in another
// shard than its original.
func TestReplayWhileFailingKeepsOneDeadLetterPerPrompt(t *testing.T) {
	t.Parallel()
	for _, shards := range []string{"1", "3"} {
		t.Run("shards="+shards, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, fastSim(), map[string]string{
				"QUEUE_SHARDS": shards, "QUEUE_FAILOVER_MAX_RETRIES": "0", "BREAKER_FAILURES": "1000",
			})
			prompts := []string{"first lost prompt", "second lost prompt", "third lost prompt"}
			r.deadLetter(true, prompts...)
			stop := r.failingConsumer()
			for round := 1; round <= 2; round++ {
				before := r.records()
				res := r.run("", "replay", "-yes", "-all")
				wantCode(t, res, admin.ExitFailed)
				if !strings.Contains(res.stderr, "0 done, 3 ended in error") {
					t.Fatalf("round %d summary:\n%s", round, res.stderr)
				}
				var after []string
				testutil.Eventually(t, 10*time.Second, func() bool {
					after = r.records()
					for _, id := range after {
						if slices.Contains(before, id) {
							return false
						}
					}
					return len(after) == 3
				}, "the three records replaced")
				for _, id := range after {
					rec, err := r.queue(true).DeadLetterByID(context.Background(), id)
					if err != nil {
						t.Fatal(err)
					}
					if rec.Replays != round || rec.Reason == "" || len(rec.Body) == 0 {
						t.Fatalf("round %d: record %+v, want %d replays and the job kept", round, rec, round)
					}
				}
				if n := r.deadLetters(); n != 3 {
					t.Fatalf("round %d: %d dead letters, want 3", round, n)
				}
			}
			stop()
			r.consumer()
			res := r.run("", "replay", "-yes", "-all")
			wantCode(t, res, admin.ExitOK)
			if !strings.Contains(res.stderr, "replayed: 3 done, 0 ended in error, 0 not enqueued; 3 dead letters deleted") {
				t.Fatalf("final replay summary:\n%s", res.stderr)
			}
			if n := r.deadLetters(); n != 0 {
				t.Fatalf("%d dead letters after the provider came back", n)
			}
			if n := r.sim.Requests(); n != 3 {
				t.Fatalf("the upstream ran %d calls for 3 prompts, want each once", n)
			}
		})
	}
}
