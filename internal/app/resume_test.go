package app

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// streamReq sends method to /v1/streams/{id} on url as user, with
// Last-Event-ID after when it is not negative.
func streamReq(tb testing.TB, ctx context.Context, method, url, id, user string, after int) *http.Response {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url+"/v1/streams/"+id, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("X-User-ID", user)
	if after >= 0 {
		req.Header.Set("Last-Event-ID", strconv.Itoa(after))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s: %v", method, err)
	}
	return resp
}

// firstChunks posts text on url as user, reads n chunks and leaves: the
// report of what arrived, and the request id.
func firstChunks(tb testing.TB, url, text, user string, n int) (loadtest.Report, string, string) {
	tb.Helper()
	ctx, cancel := context.WithCancel(tb.Context())
	defer cancel()
	resp := postStream(tb, ctx, url, prompt(text), map[string]string{"X-User-ID": user})
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("POST status %d", resp.StatusCode)
	}
	rep := loadtest.StreamCheck{StopAfter: n}.Check(resp.Body)
	if !rep.Stopped || rep.Chunks != n || rep.Lost {
		tb.Fatalf("did not get %d chunks: %+v", n, rep)
	}
	return rep, resp.Header.Get("X-Request-ID"), resp.Header.Get("X-Stream-Path")
}

// resumeRest resumes id on url after the report's last id and checks the
// rest of the stream, which must complete the reference answer.
func resumeRest(tb testing.TB, url, id, user string, before loadtest.Report, want []string) {
	tb.Helper()
	resp := streamReq(tb, tb.Context(), http.MethodGet, url, id, user, before.LastID)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		tb.Fatalf("resume: status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	after := loadtest.StreamCheck{AfterID: before.LastID}.Check(resp.Body)
	if after.Lost || after.Terminal != protocol.EventDone {
		tb.Fatalf("resumed stream: %+v", after)
	}
	if got, ref := before.Content+after.Content, strings.Join(want, ""); got != ref {
		tb.Fatalf("chunks before + after the resume:\n%q\nwant the reference\n%q", got, ref)
	}
}

// A direct stream whose client left after 5 chunks goes on generating;
// a resume on ANOTHER api process gets the rest, live.
func TestResumeDirectOnAnotherAPI(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 40 * time.Millisecond, Tokens: 40, Seed: 11}
	c := newCluster(t, sc, map[string]string{"QUEUE_FAILOVER_ENABLED": "false"})
	_, urlA := c.api(nil)
	_, urlB := c.api(nil)
	const q = "resume me elsewhere"
	before, id, path := firstChunks(t, urlA, q, "alice", 5)
	if path != protocol.PathDirect {
		t.Fatalf("path %q, want direct", path)
	}
	resumeRest(t, urlB, id, "alice", before, c.want(q))
}

// The same on the queued path: a consumer process runs the job, the first
// api relays it, and the resume is served by a second api from the log.
func TestResumeQueuedOnAnotherAPI(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 40 * time.Millisecond, Tokens: 40, Seed: 12}
	c := newCluster(t, sc, nil)
	_, urlA := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	_, urlB := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	c.consumer(nil)
	const q = "resume me from the queue"
	before, id, path := firstChunks(t, urlA, q, "alice", 5)
	if path != protocol.PathQueued {
		t.Fatalf("path %q, want queued", path)
	}
	resumeRest(t, urlB, id, "alice", before, c.want(q))
}

// Another identity, an unknown id and a malformed one get 404 for both
// resume and stop; a bad Last-Event-ID gets 400.
func TestResumeOwnership(t *testing.T) {
	t.Parallel()
	c := newCluster(t, fastSim(), map[string]string{"QUEUE_FAILOVER_ENABLED": "false"})
	_, url := c.api(nil)
	resp := postStream(t, t.Context(), url, prompt("mine"), map[string]string{"X-User-ID": "alice"})
	rep := loadtest.StreamCheck{Want: c.want("mine")}.Check(resp.Body)
	resp.Body.Close()
	if rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("stream: %+v", rep)
	}
	id := resp.Header.Get("X-Request-ID")
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, _ := c.rdb.Exists(context.Background(), streamlog.Key(c.prefix, id)).Result()
		return n == 1
	}, "the stream log written")
	for _, tc := range []struct{ method, id, user string }{
		{http.MethodGet, id, "mallory"}, {http.MethodDelete, id, "mallory"},
		{http.MethodGet, "0b6c3d1e-unknown", "alice"}, {http.MethodDelete, "0b6c3d1e-unknown", "alice"},
		{http.MethodGet, "bad%7Bid%7D", "alice"},
	} {
		resp := streamReq(t, t.Context(), tc.method, url, tc.id, tc.user, -1)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s %s as %s: status %d, want 404", tc.method, tc.id, tc.user, resp.StatusCode)
		}
		if p := readProblem(t, resp); !strings.HasSuffix(p.Type, "/"+protocol.ProblemNotFound) {
			t.Errorf("%s as %s: problem %s", tc.method, tc.user, p.Type)
		}
	}
	// The owner replays the whole stream, ids from 1.
	resp = streamReq(t, t.Context(), http.MethodGet, url, id, "alice", -1)
	replay := loadtest.StreamCheck{Want: c.want("mine")}.Check(resp.Body)
	resp.Body.Close()
	if replay.Lost || replay.Terminal != protocol.EventDone || replay.LastID != rep.LastID {
		t.Fatalf("replay: %+v (original ended at id %d)", replay, rep.LastID)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/v1/streams/"+id+"?last_event_id=x", nil)
	req.Header.Set("X-User-ID", "alice")
	bad, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if bad.StatusCode != http.StatusBadRequest {
		t.Errorf("last_event_id=x: status %d, want 400", bad.StatusCode)
	}
	bad.Body.Close()
}

// DELETE on another api process stops a direct stream at once: its
// client gets an `error` stopped, the provider call is cancelled and the
// slot is free within a second.
func TestStopDirectFromAnotherAPI(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 50 * time.Millisecond, Tokens: 1000, Seed: 3}
	c := newCluster(t, sc, map[string]string{"QUEUE_FAILOVER_ENABLED": "false", "STREAM_RESUME_WINDOW_SECONDS": "30"})
	a, urlA := c.api(nil)
	_, urlB := c.api(nil)
	resp := postStream(t, t.Context(), urlA, prompt("stop me"), map[string]string{"X-User-ID": "alice"})
	defer resp.Body.Close()
	id := resp.Header.Get("X-Request-ID")
	reportc := make(chan loadtest.Report, 1)
	chunks := make(chan struct{}, 100)
	go func() { reportc <- loadtest.StreamCheck{}.Check(&chunkSignal{r: resp.Body, c: chunks}) }()
	<-chunks
	stopped := time.Now()
	del := streamReq(t, t.Context(), http.MethodDelete, urlB, id, "alice", -1)
	del.Body.Close()
	if del.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE status %d, want 204", del.StatusCode)
	}
	testutil.Eventually(t, time.Second, func() bool { return a.pool.Stats().InUse == 0 && c.sim.Cancelled() == 1 },
		"slot freed and upstream cancelled")
	t.Logf("slot freed %v after DELETE", time.Since(stopped))
	rep := <-reportc
	if rep.Lost || rep.Terminal != protocol.EventError || !strings.HasSuffix(rep.Problem.Type, "/"+protocol.ProblemStopped) {
		t.Fatalf("stopped stream: %+v", rep)
	}
}

// DELETE stops a queued stream: the worker cancels the provider call and
// frees its slot within a second.
func TestStopQueued(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 50 * time.Millisecond, Tokens: 1000, Seed: 4}
	c := newCluster(t, sc, map[string]string{"DIRECT_PATH_ENABLED": "false", "STREAM_RESUME_WINDOW_SECONDS": "30"})
	_, url := c.api(nil)
	worker := c.consumer(nil)
	resp := postStream(t, t.Context(), url, prompt("stop me too"), map[string]string{"X-User-ID": "alice"})
	defer resp.Body.Close()
	id := resp.Header.Get("X-Request-ID")
	reportc := make(chan loadtest.Report, 1)
	chunks := make(chan struct{}, 100)
	go func() { reportc <- loadtest.StreamCheck{}.Check(&chunkSignal{r: resp.Body, c: chunks}) }()
	<-chunks
	// The gauge is sampled, so it may lag the first chunk a little.
	testutil.Eventually(t, 10*time.Second, func() bool { return worker.Metric("spillway_pool_slots_in_use") == 1 },
		"the worker holds a slot")
	stopped := time.Now()
	del := streamReq(t, t.Context(), http.MethodDelete, url, id, "alice", -1)
	del.Body.Close()
	if del.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE status %d, want 204", del.StatusCode)
	}
	testutil.Eventually(t, time.Second, func() bool { return worker.Metric("spillway_pool_slots_in_use") == 0 && c.sim.Cancelled() == 1 },
		"worker slot freed and upstream cancelled")
	t.Logf("worker slot freed %v after DELETE", time.Since(stopped))
	rep := <-reportc
	if rep.Lost || rep.Terminal != protocol.EventError || !strings.HasSuffix(rep.Problem.Type, "/"+protocol.ProblemStopped) {
		t.Fatalf("stopped stream: %+v", rep)
	}
}

// A client that leaves and does not come back within the window: the
// stream is cancelled (provider call, slot) and the log ends with
// `error` stopped, on both paths.
func TestResumeWindowExpiryCancels(t *testing.T) {
	t.Parallel()
	for _, path := range []string{protocol.PathDirect, protocol.PathQueued} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 50 * time.Millisecond, Tokens: 1000, Seed: 5}
			env := map[string]string{"STREAM_RESUME_WINDOW_SECONDS": "1"}
			if path == protocol.PathQueued {
				env["DIRECT_PATH_ENABLED"] = "false"
			} else {
				env["QUEUE_FAILOVER_ENABLED"] = "false"
			}
			c := newCluster(t, sc, env)
			a, url := c.api(nil)
			slots := func() float64 { return float64(a.pool.Stats().InUse) }
			if path == protocol.PathQueued {
				w := c.consumer(nil)
				slots = func() float64 { return w.Metric("spillway_pool_slots_in_use") }
			}
			before, id, _ := firstChunks(t, url, "walk away", "alice", 2)
			left := time.Now()
			// Still generating within the window...
			if got := slots(); got != 1 {
				t.Fatalf("slots in use %v right after the client left, want 1 (the window keeps it)", got)
			}
			testutil.Eventually(t, 4*time.Second, func() bool { return slots() == 0 && c.sim.Cancelled() == 1 },
				"window passed: upstream cancelled and slot freed")
			if d := time.Since(left); d < time.Second {
				t.Errorf("cancelled %v after the client left, before the 1s window", d)
			}
			resp := streamReq(t, t.Context(), http.MethodGet, url, id, "alice", before.LastID)
			rest := loadtest.StreamCheck{AfterID: before.LastID}.Check(resp.Body)
			resp.Body.Close()
			if rest.Lost || rest.Terminal != protocol.EventError || !strings.HasSuffix(rest.Problem.Type, "/"+protocol.ProblemStopped) {
				t.Fatalf("log after the window: %+v", rest)
			}
		})
	}
}

// A request waiting behind others gets `event: queued` with its position
// from the queue itself, positions that only go down, then its answer;
// the ids count over the queued events too.
func TestQueuedPositionEvents(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, TokenInterval: 30 * time.Millisecond, Tokens: 20, Seed: 21}
	c := newCluster(t, sc, map[string]string{"DIRECT_PATH_ENABLED": "false", "WORKER_CONCURRENCY": "1"})
	_, url := c.api(nil)
	c.consumer(nil)
	// The first request is running (so the group exists) before the rest queue.
	first := postStream(t, t.Context(), url, prompt("first"), nil)
	defer first.Body.Close()
	if rep := (loadtest.StreamCheck{StopAfter: 1}).Check(first.Body); !rep.Stopped {
		t.Fatalf("first: %+v", rep)
	}
	var ahead []*http.Response
	for i := range 3 {
		r := postStream(t, t.Context(), url, prompt("ahead "+strconv.Itoa(i)), nil)
		defer r.Body.Close()
		ahead = append(ahead, r)
	}
	const q = "where am I"
	resp := postStream(t, t.Context(), url, prompt(q), nil)
	defer resp.Body.Close()
	for _, r := range append(ahead, first) {
		go func() { _, _ = io.Copy(io.Discard, r.Body) }()
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	rep := loadtest.StreamCheck{Want: c.want(q)}.Check(strings.NewReader(string(body)))
	if rep.Lost || rep.Terminal != protocol.EventDone {
		t.Fatalf("stream: %+v", rep)
	}
	var positions []int64
	for _, ev := range strings.Split(string(body), "\n\n") {
		if data, ok := strings.CutPrefix(ev[strings.Index(ev, "\n")+1:], "event: queued\ndata: "); ok {
			var d protocol.Queued
			if err := json.Unmarshal([]byte(data), &d); err != nil {
				t.Fatalf("queued data %q: %v", data, err)
			}
			positions = append(positions, d.Position)
		}
	}
	if len(positions) == 0 || !strings.HasPrefix(string(body), "id: 1\nevent: queued\n") {
		t.Fatalf("no queued event first:\n%s", body)
	}
	if positions[0] < 1 || positions[0] > 3 {
		t.Errorf("first position %d, want 1 to 3 (3 jobs queued ahead, one maybe taken)", positions[0])
	}
	for i := 1; i < len(positions); i++ {
		if positions[i] >= positions[i-1] {
			t.Errorf("positions %v do not go down", positions)
		}
	}
	t.Logf("positions %v", positions)
}

// A resume across a takeover: the client leaves after 5 chunks, the
// consumer running the job is killed, another takes it over, and the
// resume on another api sees the rest of the first attempt, the `reset`
// (taking the next id: ids never restart) and the whole answer after it.
func TestResumeQueuedAcrossTakeover(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 100 * time.Millisecond, Tokens: 30, Seed: 13}
	c := newCluster(t, sc, nil)
	_, urlA := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	_, urlB := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	first := c.consumer(nil)
	const q = "resume across a crash"
	before, id, _ := firstChunks(t, urlA, q, "alice", 5)
	c.consumer(nil)
	first.Kill()
	resp := streamReq(t, t.Context(), http.MethodGet, urlB, id, "alice", before.LastID)
	defer resp.Body.Close()
	after := loadtest.StreamCheck{AfterID: before.LastID, Want: c.want(q)}.Check(resp.Body)
	if after.Lost || after.Terminal != protocol.EventDone {
		t.Fatalf("resumed stream: %+v", after)
	}
	if after.Resets != 1 {
		t.Fatalf("%d resets in the resumed stream, want 1", after.Resets)
	}
}

// The log writes a stream's events of one flush as one entry; a resume
// after any event of such an entry gets exactly the events after it: an
// unpaced answer (most of its chunks in a few entries) resumed on another
// api after its first event, one inside an entry, its last chunk and the
// one before.
func TestResumeInsideABatchEntry(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: time.Millisecond, Tokens: 60, Seed: 13}
	c := newCluster(t, sc, map[string]string{"QUEUE_FAILOVER_ENABLED": "false"})
	_, urlA := c.api(nil)
	_, urlB := c.api(nil)
	const q = "resume me inside a batch"
	want := c.want(q)
	resp := postStream(t, t.Context(), urlA, prompt(q), map[string]string{"X-User-ID": "alice"})
	full := loadtest.StreamCheck{}.Check(resp.Body)
	_ = resp.Body.Close()
	id := resp.Header.Get("X-Request-ID")
	if full.Lost || full.Terminal != protocol.EventDone || full.Content != strings.Join(want, "") || full.LastID != len(want)+1 {
		t.Fatalf("the whole stream: %+v", full)
	}
	key := streamlog.Key(c.prefix, id)
	testutil.Eventually(t, 5*time.Second, func() bool {
		n, _ := c.rdb.XLen(t.Context(), key).Result()
		return n > 0
	}, "the log written")
	if n := c.rdb.XLen(t.Context(), key).Val(); n > int64(len(want))/4 {
		t.Fatalf("%d log entries for %d events: not batched, so no resume falls inside an entry", n, full.LastID)
	}
	for _, after := range []int{1, 2, 17, len(want) / 2, len(want) - 1, len(want)} {
		resp := streamReq(t, t.Context(), http.MethodGet, urlB, id, "alice", after)
		rest := loadtest.StreamCheck{AfterID: after}.Check(resp.Body)
		_ = resp.Body.Close()
		if rest.Lost || rest.Terminal != protocol.EventDone || rest.LastID != full.LastID {
			t.Fatalf("resume after %d: %+v", after, rest)
		}
		if ref := strings.Join(want[after:], ""); rest.Content != ref {
			t.Fatalf("resume after %d: content %q, want %q", after, rest.Content, ref)
		}
	}
}
