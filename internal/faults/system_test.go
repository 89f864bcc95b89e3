package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// Settings of the process scenarios: whole seconds, as the settings take
// them, with the production ratios (reclaim well above a heartbeat).
const (
	procHeartbeat = time.Second
	// orphanCancelBound bounds how long after an api's crash a running job
	// of its may go on. A worker publishes at least every heartbeat, so the
	// goal is one heartbeat (measured: about 100 ms, a batch); the rest is
	// room for a machine loaded by other tests. It stays below every other
	// way such a job could end (the api's silence limit, 9 s, and the
	// queue timeout), so only the nobody-listens rule meets it.
	orphanCancelBound = procHeartbeat + 5*time.Second
	procLeaseTTL      = 3 * time.Second
	queuePrefix       = "queue:"
)

// answer is the simulated provider's answer: tokens chunks, interval apart.
type answer struct {
	tokens   int
	interval time.Duration
	seed     int64
}

// system is one scenario's redis-server, simllm process, and the settings
// every api and consumer process it starts shares.
type system struct {
	tb    testing.TB
	redis *redistest.Server
	rdb   *redis.Client
	ans   answer
	env   map[string]string
}

// newSystem starts simllm and returns the system on srv; env adds to and
// overrides the shared settings.
func newSystem(tb testing.TB, srv *redistest.Server, ans answer, env map[string]string) *system {
	tb.Helper()
	sim := start(tb, "simllm", []string{"-addr", "127.0.0.1:0"}, map[string]string{
		"SIM_TOKENS": strconv.Itoa(ans.tokens), "SIM_TOKEN_MS": strconv.Itoa(int(ans.interval / time.Millisecond)),
		"SIM_FIRST_TOKEN_MS": "5", "SIM_SEED": strconv.FormatInt(ans.seed, 10),
	}, simllmReady)
	s := &system{tb: tb, redis: srv, ans: ans, env: map[string]string{
		"REDIS_URL": srv.URL(), "LLM_PROVIDER": "openai", "LLM_BASE_URL": sim.URL() + "/v1", "LOG_LEVEL": "info",
		"POOL_BACKEND": "redis", "POOL_LEASE_TTL_SECONDS": strconv.Itoa(int(procLeaseTTL / time.Second)),
		"WORKER_HEARTBEAT_SECONDS": strconv.Itoa(int(procHeartbeat / time.Second)), "QUEUE_RECLAIM_IDLE_SECONDS": "3",
		"SHUTDOWN_GRACE_SECONDS": "1", "QUEUE_FAILOVER_BASE_DELAY_MS": "10", "QUEUE_FAILOVER_MAX_DELAY_MS": "50",
	}}
	s.rdb = redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	tb.Cleanup(func() { _ = s.rdb.Close() })
	for k, v := range env {
		s.env[k] = v
	}
	return s
}

func (s *system) with(over map[string]string) map[string]string {
	env := make(map[string]string, len(s.env)+len(over)+1)
	for k, v := range s.env {
		env[k] = v
	}
	for k, v := range over {
		env[k] = v
	}
	return env
}

// api starts a cmd/api process.
func (s *system) api(over map[string]string) *proc {
	env := s.with(over)
	env["HTTP_ADDR"] = "127.0.0.1:0"
	return start(s.tb, "api", nil, env, apiReady)
}

// consumer starts a cmd/consumer process.
func (s *system) consumer(over map[string]string) *proc {
	env := s.with(over)
	env["CONSUMER_HTTP_ADDR"] = "127.0.0.1:0"
	return start(s.tb, "consumer", nil, env, consumerReady)
}

// want is the whole answer to a prompt.
func (s *system) want(text string) []string {
	return llm.SimChunks([]protocol.Message{{Role: "user", Content: text}}, s.ans.seed, s.ans.tokens)
}

// clientStream is one client's request and what it saw. Its fields are
// set by its reader goroutine: read them after done is closed, or the
// response head through head.
type clientStream struct {
	text, user string
	status     int    // HTTP status; 0 when the request failed
	problem    string // problem slug of a refusal
	id, path   string // X-Request-ID, X-Stream-Path
	mu         sync.Mutex
	chunks     atomic.Int32
	done       chan struct{} // closed when the stream ended; rep and ended are set
	rep        loadtest.Report
	ended      time.Time
}

// head returns the request id and path once the response head arrived
// ("", "" before).
func (cs *clientStream) head() (id, path string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.id, cs.path
}

// open posts text to the api at base as user and reads the stream in the
// background, checking it against the whole answer (its first maxTokens
// chunks when maxTokens > 0, sent as max_tokens).
func (s *system) open(ctx context.Context, base, text, user string, maxTokens int) *clientStream {
	cs := &clientStream{text: text, user: user, done: make(chan struct{})}
	req := map[string]any{"messages": []map[string]string{{"role": "user", "content": text}}}
	want := s.want(text)
	if maxTokens > 0 {
		req["max_tokens"] = maxTokens
		want = want[:min(maxTokens, len(want))]
	}
	body, _ := json.Marshal(req)
	go func() {
		defer close(cs.done)
		defer func() { cs.ended = time.Now() }()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/stream", bytes.NewReader(body))
		if err != nil {
			cs.rep = loadtest.Report{Lost: true, Detail: err.Error()}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-ID", user)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cs.rep = loadtest.Report{Lost: true, Reason: loadtest.ReasonTransport, Detail: err.Error()}
			return
		}
		defer resp.Body.Close()
		cs.mu.Lock()
		cs.status, cs.id, cs.path = resp.StatusCode, resp.Header.Get("X-Request-ID"), resp.Header.Get("X-Stream-Path")
		cs.mu.Unlock()
		if resp.StatusCode != http.StatusOK {
			var p protocol.Problem
			_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&p)
			cs.problem = p.Slug()
			return
		}
		cs.rep = loadtest.StreamCheck{Want: want}.Check(&chunkTap{r: resp.Body, n: &cs.chunks})
	}()
	return cs
}

// outcome names how a stream ended: "done", an error's problem slug,
// "refused <status> <slug>", or "lost: <reason>".
func (cs *clientStream) outcome() string {
	switch {
	case cs.status != 0 && cs.status != http.StatusOK:
		return "refused " + strconv.Itoa(cs.status) + " " + cs.problem
	case cs.rep.Lost:
		return "lost: " + string(cs.rep.Reason)
	case cs.rep.Terminal == protocol.EventDone:
		return "done"
	case cs.rep.Problem != nil:
		return cs.rep.Problem.Slug()
	}
	return "lost: no terminal event"
}

// waitAll waits for every stream to end, failing the test after d.
func waitAll(tb testing.TB, css []*clientStream, d time.Duration) {
	tb.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for i, cs := range css {
		select {
		case <-cs.done:
		case <-deadline.C:
			tb.Fatalf("stream %d (%s) still open after %v", i, cs.id, d)
		}
	}
}

// tallyStreams counts streams by path and outcome ("queued done").
func tallyStreams(css []*clientStream) map[string]int {
	m := map[string]int{}
	for _, cs := range css {
		path := cs.path
		if path == "" {
			path = "none"
		}
		m[path+" "+cs.outcome()]++
	}
	return m
}

// chunkTap counts chunk events (events without a name) as the stream is
// read, so a scenario can strike mid-answer.
type chunkTap struct {
	r     io.Reader
	n     *atomic.Int32
	line  []byte
	named bool
	data  bool
}

func (c *chunkTap) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for _, b := range p[:n] {
		if b != '\n' {
			c.line = append(c.line, b)
			continue
		}
		switch l := string(c.line); {
		case l == "":
			if c.data && !c.named {
				c.n.Add(1)
			}
			c.named, c.data = false, false
		case strings.HasPrefix(l, "event:"):
			c.named = true
		case strings.HasPrefix(l, "data:"):
			c.data = true
		}
		c.line = c.line[:0]
	}
	return n, err
}

// liveLeases returns the pool's leases that have not expired (Redis
// clock), by lease id ("<holder>/<id>", the holder naming the process).
func (s *system) liveLeases(ctx context.Context) ([]string, error) {
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	return s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{
		Key: redispool.LeasesKey(queuePrefix + "pool:"), ByScore: true,
		Start: "(" + strconv.FormatInt(now.UnixMilli(), 10), Stop: "+inf",
	}).Result()
}

// leasesOf counts the leases of the process with pid among ids.
func leasesOf(ids []string, pid int) int {
	n := 0
	for _, id := range ids {
		if strings.Contains(id, "-"+strconv.Itoa(pid)+"-") {
			n++
		}
	}
	return n
}

// cancellations returns, from the consumers' logs, when each request's job
// was cancelled because nobody listened on its result channel any more
// (the api that waited for it is gone): the first time per request id.
func cancellations(consumers ...*proc) map[string]time.Time {
	out := map[string]time.Time{}
	for _, c := range consumers {
		for _, e := range c.entries("nobody listens on the result channel; cancelling the job") {
			if t, ok := out[e.RequestID]; !ok || e.Time.Before(t) {
				out[e.RequestID] = e.Time
			}
		}
	}
	return out
}

// figures collects a scenario's numbers for its FIGURES log line.
type figures struct {
	mu sync.Mutex
	kv []string
}

func (f *figures) add(k string, v any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kv = append(f.kv, k+"="+strings.TrimSpace(fmtValue(v)))
}

func fmtValue(v any) string {
	switch v := v.(type) {
	case time.Duration:
		return v.Round(time.Millisecond).String()
	case map[string]int:
		b, _ := json.Marshal(v)
		return string(b)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func (f *figures) log(tb testing.TB, name string) {
	tb.Helper()
	tb.Logf("FIGURES %s: %s", name, strings.Join(f.kv, " "))
}

// loadRun is clients streaming one request after another against one api
// until stopped.
type loadRun struct {
	mu      sync.Mutex
	streams []*clientStream
	opened  []time.Time
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// load starts concurrency clients on the api at base, each sending its
// next request as soon as its stream ended, every request a new prompt
// (name, client and turn in it) of maxTokens chunks, user name-u<client>.
func (s *system) load(ctx context.Context, base, name string, concurrency, maxTokens int) *loadRun {
	l := &loadRun{stop: make(chan struct{})}
	for c := range concurrency {
		l.wg.Go(func() {
			for turn := 0; ; turn++ {
				select {
				case <-l.stop:
					return
				case <-ctx.Done():
					return
				default:
				}
				cs := s.open(ctx, base, fmt.Sprintf("%s prompt %d-%d", name, c, turn), fmt.Sprintf("%s-u%d", name, c), maxTokens)
				l.mu.Lock()
				l.streams = append(l.streams, cs)
				l.opened = append(l.opened, time.Now())
				l.mu.Unlock()
				<-cs.done
			}
		})
	}
	return l
}

// stopStarting stops starting requests; the streams under way go on.
func (l *loadRun) stopStarting() { l.once.Do(func() { close(l.stop) }) }

// halt stops starting requests and waits for the streams under way.
func (l *loadRun) halt() {
	l.stopStarting()
	l.wg.Wait()
}

// all returns every stream so far with the time it was opened.
func (l *loadRun) all() ([]*clientStream, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*clientStream(nil), l.streams...), append([]time.Time(nil), l.opened...)
}
