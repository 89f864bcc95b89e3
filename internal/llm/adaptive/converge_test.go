package adaptive_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/adaptive"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/pool/redispool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// The convergence run: an upstream that answers 429 above upstreamCap
// calls at once (simserver with SIM_MAX_CONCURRENCY), two processes
// sharing one Redis pool of poolSize slots, clients enough to fill it.
const (
	upstreamCap = 6
	poolSize    = 24
	clients     = 8 // per process
	interval    = 200 * time.Millisecond
	runFor      = 10 * time.Second
)

// countingUpstream counts the calls in flight on the upstream and the
// 429s it sends, per sample.
type countingUpstream struct {
	next http.Handler

	mu       sync.Mutex
	inFlight int
	peak     int // most in flight since the last sample
	calls    int // calls answered since the last sample
	throttle int // of them, 429s
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		u.next.ServeHTTP(w, r)
		return
	}
	u.mu.Lock()
	u.inFlight++
	u.peak = max(u.peak, u.inFlight)
	u.mu.Unlock()
	rec := &statusRecorder{ResponseWriter: w}
	u.next.ServeHTTP(rec, r)
	u.mu.Lock()
	u.inFlight--
	u.calls++
	if rec.status == http.StatusTooManyRequests {
		u.throttle++
	}
	u.mu.Unlock()
}

// sample returns and resets the counts since the last sample.
func (u *countingUpstream) sample() (peak, calls, throttled int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	peak, calls, throttled = u.peak, u.calls, u.throttle
	u.peak, u.calls, u.throttle = u.inFlight, 0, 0
	return peak, calls, throttled
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// row is one sample of the curve.
type row struct {
	at              time.Duration
	limit           int
	peak, calls, tr int
}

// runCurve floods a pool shared by two processes, each with its
// controller when adaptive is on, and samples the curve every interval.
func runCurve(t *testing.T, adaptiveOn bool) []row {
	t.Helper()
	sim, err := llm.NewSim(llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: 10 * time.Millisecond,
		Tokens: 4, Seed: 1, MaxConcurrency: upstreamCap})
	if err != nil {
		t.Fatal(err)
	}
	up := &countingUpstream{next: simserver.New(sim, testutil.DiscardLogger())}
	ts := httptest.NewServer(up)
	t.Cleanup(ts.Close)
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	params := adaptive.Params{Floor: 1, Ceiling: poolSize, Interval: interval}

	ctx, cancel := context.WithTimeout(t.Context(), runFor)
	defer cancel()
	var wg sync.WaitGroup
	var ctrls []*adaptive.Controller
	var failures atomic.Int64
	for proc := range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = rdb.Close() })
		pcfg := redispool.Config{Prefix: prefix, Size: poolSize, PerUser: poolSize, LeaseTTL: 10 * time.Second}
		if adaptiveOn {
			pcfg.AdaptiveLimit = "global"
		}
		p, err := redispool.New(pcfg, rdb, testutil.DiscardLogger(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		client, err := llm.NewOpenAI(llm.OpenAIConfig{BaseURL: ts.URL + "/v1"})
		if err != nil {
			t.Fatal(err)
		}
		var provider llm.Provider = client
		if adaptiveOn {
			c, err := adaptive.New(adaptive.Config{Name: "global", Params: params}, p, testutil.DiscardLogger(), nil)
			if err != nil {
				t.Fatal(err)
			}
			ctrls = append(ctrls, c)
			wg.Go(func() { c.Run(ctx) })
			provider = llm.Observe(client, c.Observe)
		}
		for i := range clients {
			user := fmt.Sprintf("p%d-c%d", proc, i)
			wg.Go(func() {
				req := protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: user}}}
				for ctx.Err() == nil {
					l, err := p.Acquire(ctx, user)
					if err != nil {
						return
					}
					_, err = provider.Stream(ctx, req, func(protocol.Chunk) error { return nil })
					l.Release()
					var le *llm.Error
					if err != nil && ctx.Err() == nil && !(errors.As(err, &le) && le.Status == http.StatusTooManyRequests) {
						failures.Add(1)
					}
				}
			})
		}
	}

	var rows []row
	start := time.Now()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue // a partial interval is not a sample
		case <-tick.C:
		}
		peak, calls, tr := up.sample()
		r := row{at: time.Since(start), limit: poolSize, peak: peak, calls: calls, tr: tr}
		if adaptiveOn {
			r.limit = ctrls[0].Limit()
		}
		rows = append(rows, r)
	}
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Errorf("%d calls failed other than with 429", n)
	}
	return rows
}

// AIMD converges near the upstream's real capacity without 429 storms:
// after the first seconds the limit saws around the cap (halving just
// above it, climbing back one per interval), the upstream never sees far
// more calls than it takes, and 429s are a small share of calls, where
// the same flood without adaptive concurrency is mostly 429s. The curve
// is printed with -v (docs/bench-history/2026-11.md, "Adaptive concurrency").
func TestAIMDConvergesOnUpstreamCapacity(t *testing.T) {
	t.Parallel()
	rows := runCurve(t, true)
	t.Logf("%8s %6s %10s %6s %5s", "t", "limit", "upstream", "calls", "429s")
	for _, r := range rows {
		t.Logf("%8s %6d %10d %6d %5d", r.at.Round(10*time.Millisecond), r.limit, r.peak, r.calls, r.tr)
	}
	// The second half is the steady state.
	half := rows[len(rows)/2:]
	var sum, calls, tr, maxLimit, maxPeak int
	for _, r := range half {
		sum += r.limit
		calls += r.calls
		tr += r.tr
		maxLimit, maxPeak = max(maxLimit, r.limit), max(maxPeak, r.peak)
	}
	mean := float64(sum) / float64(len(half))
	share := float64(tr) / float64(max(calls, 1))
	t.Logf("steady state: mean limit %.1f (cap %d), highest %d, upstream peak %d, 429s %d of %d calls (%.1f%%)",
		mean, upstreamCap, maxLimit, maxPeak, tr, calls, 100*share)
	// AIMD saws between about half the cap and just above it (measured
	// 4.2 of 6); the bounds leave room for a loaded machine, where a slow
	// call can cost a second halving.
	if mean < upstreamCap/3 || mean > upstreamCap+1 {
		t.Errorf("mean limit %.1f in the steady state, want within [%d, %d]", mean, upstreamCap/3, upstreamCap+1)
	}
	// The limit itself may climb past the cap while a starved machine
	// cannot fill it (an interval with calls and no throttle adds one);
	// what must not happen is the upstream seeing far more than it takes.
	if maxPeak > upstreamCap+3 {
		t.Errorf("the upstream had %d calls at once in the steady state, want at most %d", maxPeak, upstreamCap+3)
	}
	if share > 0.10 {
		t.Errorf("429s were %.1f%% of calls in the steady state, want under 10%%", 100*share)
	}
	if maxPeak < upstreamCap {
		t.Errorf("the upstream never had %d calls at once in the steady state (peak %d): the flood did not load it", upstreamCap, maxPeak)
	}

	// The same flood with a fixed limit of the pool size: the upstream
	// refuses most calls, which is what the controller avoids.
	fixed := runCurve(t, false)
	calls, tr = 0, 0
	for _, r := range fixed[len(fixed)/2:] {
		calls += r.calls
		tr += r.tr
	}
	fshare := float64(tr) / float64(max(calls, 1))
	t.Logf("without adaptive concurrency: 429s %d of %d calls (%.1f%%)", tr, calls, 100*fshare)
	if fshare < 0.5 {
		t.Errorf("without adaptive concurrency 429s were only %.1f%% of calls: the upstream does not limit as the test assumes", 100*fshare)
	}
}
