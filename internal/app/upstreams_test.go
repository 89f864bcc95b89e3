package app

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/simserver"
	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/redistest"
)

// peakUpstream is a simllm upstream that counts the chat calls in flight
// and remembers the most it ever had at once.
type peakUpstream struct {
	url             string
	calls, now, top atomic.Int64
}

func startPeakUpstream(tb testing.TB, sc llm.SimConfig) *peakUpstream {
	tb.Helper()
	sim, err := llm.NewSim(sc)
	if err != nil {
		tb.Fatal(err)
	}
	inner := simserver.New(sim, testLog(tb))
	u := &peakUpstream{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/chat/completions") {
			u.calls.Add(1)
			n := u.now.Add(1)
			defer u.now.Add(-1)
			for {
				top := u.top.Load()
				if n <= top || u.top.CompareAndSwap(top, n) {
					break
				}
			}
		}
		inner.ServeHTTP(w, r)
	}))
	tb.Cleanup(ts.Close)
	u.url = ts.URL + "/v1"
	return u
}

// Two api processes share one Redis and two capped upstreams: together
// they never put more than the cap on either upstream, both upstreams get
// work, and requests that find every upstream full go to the queue and
// still complete — nothing is refused and nothing is lost.
func TestSeveralUpstreamsShareCapsAcrossApis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	t.Parallel()
	const capEach = 2
	sc := llm.SimConfig{FirstToken: 5 * time.Millisecond, TokenInterval: 5 * time.Millisecond, Tokens: 20, Seed: 11}
	up1, up2 := startPeakUpstream(t, sc), startPeakUpstream(t, sc)
	r := redistest.Start(t)
	env := map[string]string{
		"REDIS_URL": r.URL(), "QUEUE_PREFIX": redistest.Prefix(t),
		"LLM_PROVIDER": "openai", "LLM_BASE_URL": up1.url + "," + up2.url,
		"LLM_UPSTREAM_MAX_CONCURRENCY": fmt.Sprint(capEach),
		"CONNECTION_POOL_SIZE":         "50", "CONNECTION_POOL_PER_USER": "50",
		"EMBEDDED_WORKERS": "true", "WORKER_CONCURRENCY": "4",
		"WORKER_HEARTBEAT_SECONDS": "1", "QUEUE_RECLAIM_IDLE_SECONDS": "2",
		"QUEUE_FAILOVER_BASE_DELAY_MS": "10", "QUEUE_FAILOVER_MAX_DELAY_MS": "50",
		"SHUTDOWN_GRACE_SECONDS": "1",
	}
	_, url1, _ := startAPI(t, testConfig(t, env))
	_, url2, _ := startAPI(t, testConfig(t, env))

	const n = 24
	var (
		wg     sync.WaitGroup
		queued atomic.Int64
	)
	for i := range n {
		wg.Go(func() {
			url := url1
			if i%2 == 1 {
				url = url2
			}
			text := fmt.Sprint("several upstreams ", i)
			resp := postStream(t, t.Context(), url, prompt(text), map[string]string{"X-User-ID": fmt.Sprint("u", i)})
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: status %d", i, resp.StatusCode)
				return
			}
			rep := loadtest.CheckStream(resp.Body, llm.SimChunks(userMsgs(text), sc.Seed, sc.Tokens))
			if rep.Lost || rep.Terminal != protocol.EventDone {
				t.Errorf("request %d: lost=%v reason=%s detail=%s terminal=%q", i, rep.Lost, rep.Reason, rep.Detail, rep.Terminal)
				return
			}
			if rep.Done.Path == protocol.PathQueued {
				queued.Add(1)
			}
		})
	}
	wg.Wait()
	for i, u := range []*peakUpstream{up1, up2} {
		if top := u.top.Load(); top > capEach {
			t.Errorf("upstream %d had %d calls at once, cap %d", i+1, top, capEach)
		}
		if u.calls.Load() == 0 {
			t.Errorf("upstream %d got no call", i+1)
		}
	}
	// 24 concurrent requests on 4 upstream slots: most must have waited
	// in the queue rather than been refused.
	if queued.Load() == 0 {
		t.Errorf("no request took the queued path although every upstream was full")
	}
	t.Logf("calls %d/%d, peaks %d/%d, queued %d of %d", up1.calls.Load(), up2.calls.Load(), up1.top.Load(), up2.top.Load(), queued.Load(), n)
}
