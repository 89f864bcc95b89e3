package admin_test

// System tests of spillway-admin: a real redis-server per test
// (internal/redistest), a simulated OpenAI-compatible upstream over HTTP
// (simserver), a real consumer (app.RunConsumer) and the tool wired as
// cmd/spillway-admin wires it (app.RunAdmin). Dead letters are made the
// way a worker makes them: a job enqueued, fetched and dead-lettered.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/admin"
	"github.com/spillway-dev/spillway/internal/app"
	"github.com/spillway-dev/spillway/internal/config"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// rig is one test's Redis, upstream and settings.
type rig struct {
	t      *testing.T
	rdb    *redis.Client
	sim    *simserver.Server
	prefix string
	seed   int64
	tokens int
	env    map[string]string
}

func newRig(t *testing.T, sc llm.SimConfig, extra map[string]string) *rig {
	t.Helper()
	srv := redistest.Start(t)
	r := &rig{t: t, rdb: srv.Client(t), prefix: redistest.Prefix(t), seed: sc.Seed, tokens: sc.Tokens}
	sim, err := llm.NewSim(sc)
	if err != nil {
		t.Fatal(err)
	}
	r.sim = simserver.New(sim, testutil.DiscardLogger())
	ts := httptest.NewServer(r.sim)
	t.Cleanup(ts.Close)
	r.env = map[string]string{
		"REDIS_URL": srv.URL(), "QUEUE_PREFIX": r.prefix,
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": ts.URL + "/v1",
		"WORKER_HEARTBEAT_SECONDS": "1", "QUEUE_RECLAIM_IDLE_SECONDS": "3",
		"SHUTDOWN_GRACE_SECONDS": "1", "CONSUMER_HTTP_ADDR": "127.0.0.1:0",
		"DEAD_LETTER_KEEP_PAYLOAD": "true",
	}
	for k, v := range extra {
		r.env[k] = v
	}
	return r
}

func fastSim() llm.SimConfig {
	return llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 2 * time.Millisecond, Tokens: 12, Seed: 7}
}

func (r *rig) config(over map[string]string) *config.Config {
	r.t.Helper()
	env := make(map[string]string, len(r.env))
	for k, v := range r.env {
		env[k] = v
	}
	for k, v := range over {
		env[k] = v
	}
	cfg, err := config.Load("", env)
	if err != nil {
		r.t.Fatalf("config: %v", err)
	}
	return cfg
}

// consumer runs a worker process's code in the test until it ends.
func (r *rig) consumer() {
	r.t.Helper()
	cfg := r.config(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunConsumer(ctx, cfg, testutil.DiscardLogger()) }()
	r.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			r.t.Error("consumer did not stop within 30s")
		}
	})
}

// queue is a Redis Streams queue on the rig's keys.
func (r *rig) queue(keep bool) *redisstream.Queue {
	r.t.Helper()
	cfg := r.config(nil)
	qc := app.RedisStreamConfig(cfg, "seed")
	qc.KeepPayload = keep
	q, err := redisstream.New(qc, r.rdb)
	if err != nil {
		r.t.Fatal(err)
	}
	return q
}

func msgs(text string) []protocol.Message {
	return []protocol.Message{{Role: "user", Content: text}}
}

// deadLetter makes one dead letter per prompt, as a worker would, and
// returns their ids oldest first.
func (r *rig) deadLetter(keep bool, prompts ...string) []string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q := r.queue(keep)
	before, _ := q.DeadLetters(ctx, 1<<20)
	for i, p := range prompts {
		now := time.Now()
		id := fmt.Sprintf("orig-%d-%d", i, now.UnixNano())
		body, err := protocol.EncodeJob(protocol.Job{
			RequestID: id, UserID: "alice",
			Payload: protocol.ChatRequest{Messages: msgs(p)}, EnqueueTime: now, Deadline: now.Add(time.Second),
		})
		if err != nil {
			r.t.Fatal(err)
		}
		if err := q.Enqueue(ctx, id, body); err != nil {
			r.t.Fatal(err)
		}
		ds, err := q.Fetch(ctx, 1)
		if err != nil || len(ds) != 1 {
			r.t.Fatalf("Fetch: %v %v", ds, err)
		}
		if err := q.DeadLetter(ctx, ds[0], "provider-error: upstream kept failing"); err != nil {
			r.t.Fatal(err)
		}
		// Dead letters are listed by the Redis millisecond they failed in,
		// then by shard (DeadLetterPage): on a fast machine several fail
		// in one millisecond on different shards, and the list would not
		// follow the prompts. The next one fails in a later millisecond.
		failed := time.Now().UnixMilli()
		for time.Now().UnixMilli() <= failed {
			runtime.Gosched()
		}
	}
	after, err := q.DeadLetters(ctx, 1<<20)
	if err != nil {
		r.t.Fatal(err)
	}
	var ids []string
	for _, d := range after[len(before):] {
		ids = append(ids, d.ID)
	}
	return ids
}

// deadLetterRaw dead-letters a job body as it is, and returns its id.
func (r *rig) deadLetterRaw(body []byte) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q := r.queue(true)
	if err := q.Enqueue(ctx, "raw", body); err != nil {
		r.t.Fatal(err)
	}
	ds, err := q.Fetch(ctx, 1)
	if err != nil || len(ds) != 1 {
		r.t.Fatalf("Fetch: %v %v", ds, err)
	}
	if err := q.DeadLetter(ctx, ds[0], "malformed job"); err != nil {
		r.t.Fatal(err)
	}
	dls, err := q.DeadLetters(ctx, 1<<20)
	if err != nil || len(dls) == 0 {
		r.t.Fatalf("DeadLetters: %v %v", dls, err)
	}
	return dls[len(dls)-1].ID
}

func (r *rig) deadLetters() int64 {
	r.t.Helper()
	n, err := r.queue(true).DeadLetterDepth(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *rig) backlog() int64 {
	r.t.Helper()
	n, err := r.queue(true).Depth(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *rig) answer(prompt string) string {
	return strings.Join(llm.SimChunks(msgs(prompt), r.seed, r.tokens), "")
}

// syncBuffer is a bytes.Buffer the tool writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type result struct {
	code           int
	stdout, stderr string
}

// admin runs one spillway-admin command line with stdin.
func (r *rig) admin(ctx context.Context, over map[string]string, stdin string, args ...string) result {
	r.t.Helper()
	var out, errb syncBuffer
	code := app.RunAdmin(ctx, r.config(over), testutil.DiscardLogger(), args,
		app.AdminIO{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errb})
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func (r *rig) run(stdin string, args ...string) result {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return r.admin(ctx, nil, stdin, args...)
}

func wantCode(tb testing.TB, res result, code int) {
	tb.Helper()
	if res.code != code {
		tb.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", res.code, code, res.stdout, res.stderr)
	}
}

// logged reads a request's stream log: its owner and its events.
func (r *rig) logged(requestID string) (string, []streamlog.Event) {
	r.t.Helper()
	rd, err := streamlog.NewReader(r.prefix, r.rdb)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx := context.Background()
	owner, err := rd.Owner(ctx, requestID)
	if err != nil {
		r.t.Fatalf("stream log of %s: %v", requestID, err)
	}
	evs, _, err := rd.Read(ctx, requestID, "", 0)
	if err != nil {
		r.t.Fatalf("read stream log of %s: %v", requestID, err)
	}
	return owner, evs
}

// wantLoggedAnswer checks a request's stream log holds the whole answer to
// prompt, ids 1, 2, 3, … and a done, owned by the original caller.
func (r *rig) wantLoggedAnswer(requestID, prompt string) {
	r.t.Helper()
	var owner string
	var evs []streamlog.Event
	testutil.Eventually(r.t, 30*time.Second, func() bool {
		owner, evs = r.logged(requestID)
		return len(evs) > 0 && evs[len(evs)-1].Name == protocol.EventDone
	}, "the replay's done in its stream log")
	if owner != "alice" {
		r.t.Fatalf("stream log owner %q, want alice", owner)
	}
	var text strings.Builder
	for i, ev := range evs {
		if ev.ID != int64(i+1) {
			r.t.Fatalf("stream log event %d has id %d", i, ev.ID)
		}
		if ev.Name == "" {
			var c struct{ Content string }
			if err := json.Unmarshal(ev.Data, &c); err != nil {
				r.t.Fatal(err)
			}
			text.WriteString(c.Content)
		}
	}
	var d protocol.Done
	if err := json.Unmarshal(evs[len(evs)-1].Data, &d); err != nil || d.RequestID != requestID || d.Path != protocol.PathQueued {
		r.t.Fatalf("done event %s (%v), want request %s on the queued path", evs[len(evs)-1].Data, err, requestID)
	}
	if text.String() != r.answer(prompt) {
		r.t.Fatalf("logged answer %q, want %q", text.String(), r.answer(prompt))
	}
}

var replayHeader = regexp.MustCompile(`== replay (\d+)/(\d+): dead letter (\S+) \(request (\S+)\) as request (\S+)`)

// TestReplayPrintsAnswers: replay subscribes, enqueues under a new request
// id, prints each answer whole, keeps it in the stream log for the
// original caller, and deletes the dead letters it answered; on one
// stream and on a sharded queue.
func TestReplayPrintsAnswers(t *testing.T) {
	t.Parallel()
	for _, shards := range []string{"1", "3"} {
		t.Run("shards="+shards, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, fastSim(), map[string]string{"QUEUE_SHARDS": shards})
			prompts := []string{"first lost prompt", "second lost prompt", "third lost prompt"}
			ids := r.deadLetter(true, prompts...)
			r.consumer()
			res := r.run("", "replay", "-yes", ids[2], ids[0], ids[1])
			wantCode(t, res, admin.ExitOK)
			heads := replayHeader.FindAllStringSubmatch(res.stdout, -1)
			if len(heads) != 3 {
				t.Fatalf("%d replay headers, want 3:\n%s", len(heads), res.stdout)
			}
			sections := replayHeader.Split(res.stdout, -1)[1:]
			seen := map[string]bool{}
			for i, h := range heads {
				dl, orig, newID := h[3], h[4], h[5]
				if seen[newID] || strings.HasPrefix(newID, "orig") || !strings.HasPrefix(orig, "orig-") {
					t.Fatalf("replay %d: new id %q for original %q: want a fresh id", i, newID, orig)
				}
				seen[newID] = true
				prompt := prompts[map[string]int{ids[0]: 0, ids[1]: 1, ids[2]: 2}[dl]]
				want := r.answer(prompt)
				if !strings.Contains(sections[i], "\n"+want+"\n== done: request "+newID) {
					t.Fatalf("replay of %s (%q): output %q, want the answer %q then done", dl, prompt, sections[i], want)
				}
				r.wantLoggedAnswer(newID, prompt)
			}
			if !strings.Contains(res.stderr, "replayed: 3 done, 0 ended in error, 0 not enqueued; 3 dead letters deleted") {
				t.Fatalf("summary missing:\n%s", res.stderr)
			}
			if n := r.deadLetters(); n != 0 {
				t.Fatalf("%d dead letters left after replaying all", n)
			}
			testutil.Eventually(t, 30*time.Second, func() bool { return r.backlog() == 0 }, "queue empty after the replay")
		})
	}
}

// TestReplayDetach: -detach prints one "<dead letter> <new request id>"
// line per replay and nothing of the answers, which are in the stream log.
// -batch bounds how many replays are enqueued at once.
func TestReplayDetach(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 50 * time.Millisecond, TokenInterval: 10 * time.Millisecond, Tokens: 10, Seed: 3}
	r := newRig(t, sc, map[string]string{"WORKER_CONCURRENCY": "16", "CONNECTION_POOL_SIZE": "50", "CONNECTION_POOL_PER_USER": "50"})
	var prompts []string
	for i := range 7 {
		prompts = append(prompts, fmt.Sprintf("detached prompt %d", i))
	}
	ids := r.deadLetter(true, prompts...)
	r.consumer()

	// Watch the upstream: it never runs more than a batch at once.
	ctx, cancel := context.WithCancel(context.Background())
	var most int64
	var watch sync.WaitGroup
	watch.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				most = max(most, r.sim.Active())
			}
		}
	})
	res := r.run("", "replay", "-all", "-detach", "-yes", "-batch", "3")
	cancel()
	watch.Wait()
	wantCode(t, res, admin.ExitOK)
	if most > 3 {
		t.Fatalf("the upstream ran %d answers at once; batches of 3 allow 3", most)
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if len(lines) != len(ids) {
		t.Fatalf("stdout %q, want %d lines", res.stdout, len(ids))
	}
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) != 2 || f[0] != ids[i] {
			t.Fatalf("line %d = %q, want %q and a new request id", i, line, ids[i])
		}
		r.wantLoggedAnswer(f[1], prompts[i])
	}
	if n := r.deadLetters(); n != 0 {
		t.Fatalf("%d dead letters left", n)
	}
}

// TestReplayConfirmation: without -yes nothing happens unless the answer
// is yes; no answer at all is a no.
func TestReplayConfirmation(t *testing.T) {
	t.Parallel()
	r := newRig(t, fastSim(), nil)
	ids := r.deadLetter(true, "confirm me")
	for _, stdin := range []string{"", "n\n", "maybe\n"} {
		res := r.run(stdin, "replay", ids[0])
		wantCode(t, res, admin.ExitAborted)
		if !strings.Contains(res.stderr, "Replay 1 dead letters as new requests") {
			t.Fatalf("no question asked:\n%s", res.stderr)
		}
	}
	if r.backlog() != 0 || r.deadLetters() != 1 {
		t.Fatalf("backlog %d, dead letters %d after refusals; want 0 and 1", r.backlog(), r.deadLetters())
	}
	r.consumer()
	wantCode(t, r.run("yes\n", "replay", ids[0]), admin.ExitOK)
	if n := r.deadLetters(); n != 0 {
		t.Fatalf("%d dead letters after a confirmed replay", n)
	}
}

// TestReplayRefusals: a dead letter whose job was not kept cannot be
// replayed, a missing one is reported, and in both cases nothing is
// enqueued; -all replays what it can and says what it could not.
func TestReplayRefusals(t *testing.T) {
	t.Parallel()
	r := newRig(t, fastSim(), nil)
	kept := r.deadLetter(true, "kept prompt")
	redacted := r.deadLetter(false, "secret prompt")

	poison := r.deadLetterRaw([]byte("poison \x1b[2J"))
	show := r.run("", "show", poison)
	wantCode(t, show, admin.ExitOK)
	if !strings.Contains(show.stdout, "the job does not decode") || strings.Contains(show.stdout, "\x1b") {
		t.Fatalf("show of an undecodable job:\n%q", show.stdout)
	}
	wantCode(t, r.run("", "replay", "-yes", poison), admin.ExitNotReplayable)
	wantCode(t, r.run("", "purge", "-yes", poison), admin.ExitOK)

	res := r.run("", "replay", "-yes", kept[0], redacted[0])
	wantCode(t, res, admin.ExitNotReplayable)
	if !strings.Contains(res.stderr, "DEAD_LETTER_KEEP_PAYLOAD") {
		t.Fatalf("no hint at DEAD_LETTER_KEEP_PAYLOAD:\n%s", res.stderr)
	}
	wantCode(t, r.run("", "replay", "-yes", kept[0], "1-1"), admin.ExitNotFound)
	if r.backlog() != 0 {
		t.Fatalf("backlog %d after refused replays", r.backlog())
	}

	show = r.run("", "show", redacted[0])
	wantCode(t, show, admin.ExitOK)
	if strings.Contains(show.stdout, "secret prompt") || !strings.Contains(show.stdout, "prompt:      not kept") {
		t.Fatalf("show of a redacted dead letter:\n%s", show.stdout)
	}

	r.consumer()
	res = r.run("", "replay", "-yes", "-all")
	wantCode(t, res, admin.ExitNotReplayable)
	if !strings.Contains(res.stdout, r.answer("kept prompt")) || !strings.Contains(res.stderr, "1 cannot be replayed and stay") {
		t.Fatalf("replay -all:\nstdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	}
	if n := r.deadLetters(); n != 1 {
		t.Fatalf("%d dead letters, want the redacted one", n)
	}

	for _, args := range [][]string{
		{"replay"}, {"replay", "-all", kept[0]}, {"replay", "-batch", "51", "-all"}, {"replay", "-bogus"},
		{"show"}, {"list", "x"}, {"list", "-n", "0"}, {"purge"}, {"frobnicate"}, {},
	} {
		if res := r.run("", args...); res.code != admin.ExitUsage {
			t.Errorf("%q: exit %d, want %d (stderr %s)", args, res.code, admin.ExitUsage, res.stderr)
		}
	}
}

// TestReplayInterrupted: stopping the command mid-answer cancels the job
// (the upstream call ends) and keeps its dead letter.
func TestReplayInterrupted(t *testing.T) {
	t.Parallel()
	sc := llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: 50 * time.Millisecond, Tokens: 400, Seed: 5}
	r := newRig(t, sc, nil)
	ids := r.deadLetter(true, "a long answer")
	r.consumer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	done := make(chan int, 1)
	cfg := r.config(nil)
	go func() {
		done <- app.RunAdmin(ctx, cfg, testutil.DiscardLogger(), []string{"replay", "-yes", ids[0]},
			app.AdminIO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
	}()
	first := llm.SimChunks(msgs("a long answer"), sc.Seed, sc.Tokens)[0]
	testutil.Eventually(t, 20*time.Second, func() bool { return strings.Contains(out.String(), first) }, "the answer streaming")
	cancel()
	select {
	case code := <-done:
		if code != admin.ExitFailed {
			t.Fatalf("exit %d after an interrupt, want %d\n%s\n%s", code, admin.ExitFailed, out.String(), errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("replay did not stop within 30s of its interrupt")
	}
	if !strings.Contains(errb.String(), "1 interrupted (cancelled)") {
		t.Fatalf("summary: %s", errb.String())
	}
	testutil.Eventually(t, 30*time.Second, func() bool { return r.sim.Cancelled() >= 1 }, "the upstream call cancelled")
	if n := r.deadLetters(); n != 1 {
		t.Fatalf("%d dead letters after an interrupted replay, want 1 (kept)", n)
	}
}

// TestReplayStopsAtOverflow: a batch that would take the backlog over
// QUEUE_OVERFLOW_THRESHOLD is not enqueued.
func TestReplayStopsAtOverflow(t *testing.T) {
	t.Parallel()
	r := newRig(t, fastSim(), map[string]string{"QUEUE_OVERFLOW_THRESHOLD": "3", "QUEUE_OVERFLOW_HYSTERESIS": "1"})
	ids := r.deadLetter(true, "one", "two")
	q := r.queue(true)
	for range 2 {
		if err := q.Enqueue(context.Background(), "waiting", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	res := r.run("", "replay", "-yes", ids[0], ids[1])
	wantCode(t, res, admin.ExitFailed)
	if !strings.Contains(res.stderr, "QUEUE_OVERFLOW_THRESHOLD") || !strings.Contains(res.stderr, "2 not started") {
		t.Fatalf("stderr:\n%s", res.stderr)
	}
	if r.backlog() != 2 || r.deadLetters() != 2 {
		t.Fatalf("backlog %d, dead letters %d; want 2 and 2", r.backlog(), r.deadLetters())
	}
}

// TestListShowPurge: list pages oldest first with a cursor, as a table or
// JSON lines; show prints the prompt; purge deletes named records or all,
// after confirmation.
func TestListShowPurge(t *testing.T) {
	t.Parallel()
	r := newRig(t, fastSim(), map[string]string{"QUEUE_SHARDS": "2"})
	prompts := []string{"p0", "p1", "p2", "p3", "p4"}
	ids := r.deadLetter(true, prompts...)

	res := r.run("", "list", "-n", "2")
	wantCode(t, res, admin.ExitOK)
	if !strings.Contains(res.stderr, "5 dead letters (redis)") {
		t.Fatalf("list stderr: %s", res.stderr)
	}
	rows := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if len(rows) != 3 || !strings.HasPrefix(rows[0], "ID") || !strings.HasPrefix(rows[1], ids[0]+" ") || !strings.HasPrefix(rows[2], ids[1]+" ") {
		t.Fatalf("list -n 2:\n%s", res.stdout)
	}
	if !strings.Contains(rows[1], "B kept") || !strings.Contains(rows[1], "provider-error: upstream kept failing") {
		t.Fatalf("row %q lacks the job column or the reason", rows[1])
	}
	m := regexp.MustCompile(`-after '([^']+)'`).FindStringSubmatch(res.stderr)
	if m == nil {
		t.Fatalf("no cursor for the rest:\n%s", res.stderr)
	}
	rest := r.run("", "list", "-json", "-after", m[1])
	wantCode(t, rest, admin.ExitOK)
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(rest.stdout), "\n") {
		var rec struct {
			ID      string `json:"id"`
			JobKept bool   `json:"job_kept"`
			Attempt int    `json:"attempt"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil || !rec.JobKept || rec.Attempt != 1 {
			t.Fatalf("list -json line %q: %+v %v", line, rec, err)
		}
		got = append(got, rec.ID)
	}
	if strings.Join(got, " ") != strings.Join(ids[2:], " ") || strings.Contains(rest.stderr, "more:") {
		t.Fatalf("the rest = %v, want %v and no more", got, ids[2:])
	}

	show := r.run("", "show", ids[3])
	wantCode(t, show, admin.ExitOK)
	if !strings.Contains(show.stdout, "--- user\np3\n") || !strings.Contains(show.stdout, "user:        alice") {
		t.Fatalf("show:\n%s", show.stdout)
	}
	sj := r.run("", "show", "-json", ids[3])
	var rec struct {
		Job protocol.Job `json:"job"`
	}
	if err := json.Unmarshal([]byte(sj.stdout), &rec); err != nil || rec.Job.Payload.Messages[0].Content != "p3" {
		t.Fatalf("show -json %s: %v", sj.stdout, err)
	}
	wantCode(t, r.run("", "show", "0:1-1"), admin.ExitNotFound)

	wantCode(t, r.run("", "purge", ids[0], ids[1]), admin.ExitAborted)
	wantCode(t, r.run("", "purge", "-yes", ids[0], "0:1-1"), admin.ExitNotFound)
	if n := r.deadLetters(); n != 5 {
		t.Fatalf("%d dead letters after refused purges, want 5", n)
	}
	wantCode(t, r.run("y\n", "purge", ids[0], ids[1]), admin.ExitOK)
	if n := r.deadLetters(); n != 3 {
		t.Fatalf("%d dead letters after purging two, want 3", n)
	}
	wantCode(t, r.run("no\n", "purge", "-all"), admin.ExitAborted)
	res = r.run("", "purge", "-all", "-yes")
	wantCode(t, res, admin.ExitOK)
	if n := r.deadLetters(); n != 0 || !strings.Contains(res.stderr, "purged 3 dead letters") {
		t.Fatalf("%d dead letters after purge -all (%s)", n, res.stderr)
	}
}

// TestNeedsRedis: embedded mode has no dead letters to reach.
func TestNeedsRedis(t *testing.T) {
	t.Parallel()
	cfg, err := config.Load("", map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb syncBuffer
	code := app.RunAdmin(context.Background(), cfg, testutil.DiscardLogger(), []string{"list"},
		app.AdminIO{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb})
	if code != admin.ExitUsage || !strings.Contains(errb.String(), "REDIS_URL") {
		t.Fatalf("exit %d, stderr %q; want %d naming REDIS_URL", code, errb.String(), admin.ExitUsage)
	}
}
