package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// TestResumeAfterProducerCrash (issue 29): a client reads a few chunks of
// a long answer from one api and leaves (the resume window keeps the
// answer going); that api is SIGKILLed; the client resumes on another api.
// Nothing writes the log any more, and the producer's liveness marker is
// refreshed no more: the resume ends with `error` `stream-expired` within
// the liveness window (3 SSE heartbeats, here 1 s each) and a read of the
// log, not after the log's TTL of pings.
func TestResumeAfterProducerCrash(t *testing.T) {
	t.Parallel()
	const heartbeat = time.Second
	sys := newSystem(t, redistest.Start(t), answer{tokens: 400, interval: 50 * time.Millisecond, seed: 51}, map[string]string{
		"HEARTBEAT_INTERVAL_SECONDS": strconv.Itoa(int(heartbeat / time.Second)), "STREAM_RESUME_WINDOW_SECONDS": "60",
		"QUEUE_FAILOVER_ENABLED": "false",
	})
	victim, other := sys.api(nil), sys.api(nil)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	body, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": "a long answer"}}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, victim.URL()+"/v1/stream", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("X-Request-ID")
	before := loadtest.StreamCheck{StopAfter: 5}.Check(resp.Body)
	resp.Body.Close()
	if !before.Stopped || before.Chunks != 5 {
		t.Fatalf("first chunks: %+v", before)
	}
	killed := time.Now()
	victim.Kill()

	rreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, other.URL()+"/v1/streams/"+id, nil)
	rreq.Header.Set("X-User-ID", "alice")
	rreq.Header.Set("Last-Event-ID", strconv.Itoa(before.LastID))
	rresp, err := http.DefaultClient.Do(rreq)
	if err != nil {
		t.Fatal(err)
	}
	defer rresp.Body.Close()
	if rresp.StatusCode != http.StatusOK {
		t.Fatalf("resume status %d", rresp.StatusCode)
	}
	after := loadtest.StreamCheck{AfterID: before.LastID}.Check(rresp.Body)
	ended := time.Since(killed)
	if after.Terminal != protocol.EventError || after.Problem == nil || after.Problem.Slug() != protocol.ProblemStreamExpired {
		t.Fatalf("resume of the dead api's stream ended %+v after %v, want error stream-expired", after, ended)
	}
	// The marker lives 3 heartbeats from its last refresh; the reader
	// looks once a second; the rest is room for a loaded machine.
	if bound := 3*heartbeat + time.Second + 3*time.Second; ended > bound {
		t.Errorf("resume ended %v after the producer's crash, want within %v", ended, bound)
	}
	var f figures
	f.add("chunks_before_crash", before.Chunks)
	f.add("chunks_after_resume", after.Chunks)
	f.add("resume_ended_after_crash", ended)
	f.add("pings", after.Pings)
	f.log(t, "resume-after-producer-crash")
}
