package app

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// With a backlog between the low and normal shedding levels, on real
// Redis: a low request is refused with 503 queue-overflow, normal and high
// ones are queued, and once workers drain the backlog every accepted one
// completes.
func TestQueueShedsLowPriorityFirst(t *testing.T) {
	t.Parallel()
	// Built before the backlog: on a loaded machine the build alone can
	// outlast the queue timeout of the requests waiting for it.
	binary(t, "consumer")
	// Threshold 20: low refused from 6, normal from 16, high at 20. A
	// backlog of 6 is 30 % of the threshold: degradation level 1, which
	// refuses nothing (from 50 %, level 2 would refuse low on its own, and
	// hold for 30 s after the backlog drained).
	c := newCluster(t, fastSim(), map[string]string{
		"QUEUE_OVERFLOW_THRESHOLD": "20", "QUEUE_OVERFLOW_HYSTERESIS": "2", "QUEUE_DEPTH_CACHE_TTL_MS": "20",
		"QUEUE_RETRY_AFTER_SECONDS": "7", "QUEUE_SHED_LOW_FRACTION": "0.3",
	})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false", "PRIORITY_MAX": "high"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type sent struct {
		resp *http.Response
		text string
	}
	var accepted []sent
	for i := range 6 {
		text := "backlog " + strconv.Itoa(i)
		resp := postStream(t, ctx, url, prompt(text), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("backlog request %d: %d", i, resp.StatusCode)
		}
		accepted = append(accepted, sent{resp, text})
	}
	// The gate reads a cached depth: wait until it has read the backlog.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return scrape(t, url+"/metrics", "spillway_queue_depth") >= 6
	}, "the gate reading a backlog of 6")

	refused := postStream(t, ctx, url, prompt("low"), map[string]string{"X-Priority": "low"})
	ra, _ := strconv.Atoi(refused.Header.Get("Retry-After"))
	if refused.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("low priority at a backlog of 6: HTTP %d, want 503", refused.StatusCode)
	}
	if p := readProblem(t, refused); p.Slug() != protocol.ProblemQueueOverflow || ra < 1 || ra > 7 {
		t.Fatalf("low priority refusal %+v Retry-After %d, want queue-overflow within [1, 7]", p, ra)
	}
	for _, prio := range []string{"normal", "high"} {
		resp := postStream(t, ctx, url, prompt(prio), map[string]string{"X-Priority": prio})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s priority at a backlog of 6: HTTP %d, want a queued stream", prio, resp.StatusCode)
		}
		accepted = append(accepted, sent{resp, prio})
	}
	metrics := url + "/metrics"
	if got := scrape(t, metrics, `spillway_queue_rejections_total{priority="low",reason="overflow"}`); got != 1 {
		t.Errorf("low overflow rejections %v, want 1", got)
	}
	for _, prio := range []string{"normal", "high"} {
		if got := scrape(t, metrics, `spillway_queue_rejections_total{priority="`+prio+`",reason="overflow"}`); got != 0 {
			t.Errorf("%s overflow rejections %v, want 0", prio, got)
		}
	}

	c.consumer(nil)
	for _, s := range accepted {
		rep := loadtest.StreamCheck{Want: c.want(s.text)}.Check(s.resp.Body)
		s.resp.Body.Close()
		if rep.Lost || rep.Terminal != protocol.EventDone {
			t.Fatalf("accepted request %q: %+v", s.text, rep)
		}
	}
	// Drained below low's resume level, low is queued again.
	testutil.Eventually(t, 5*time.Second, func() bool {
		resp := postStream(t, ctx, url, prompt("low after drain"), map[string]string{"X-Priority": "low"})
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && loadtest.StreamCheck{Want: nil}.Check(resp.Body).Terminal == protocol.EventDone
	}, "low priority accepted after the backlog drained")
}

// A backlog of mixed priorities, on real Redis, drained by one consumer
// with one slot: the jobs start high first, then normal, then low, first
// come first served within each, whatever order they were sent in.
func TestQueueStartsHigherPriorityFirst(t *testing.T) {
	t.Parallel()
	binary(t, "consumer") // before the backlog, which waits for it
	c := newCluster(t, fastSim(), map[string]string{"CONNECTION_POOL_SIZE": "1", "PRIORITY_MAX": "high"})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sent := []struct{ name, prio string }{
		{"low-1", "low"}, {"normal-1", "normal"}, {"high-1", "high"},
		{"low-2", "low"}, {"normal-2", "normal"}, {"high-2", "high"},
	}
	type answer struct {
		name string
		rep  loadtest.Report
	}
	start := time.Now()
	answers := make(chan answer, len(sent))
	for _, s := range sent {
		resp := postStream(t, ctx, url, prompt(s.name), map[string]string{"X-Priority": s.prio})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: HTTP %d", s.name, resp.StatusCode)
		}
		go func() {
			defer resp.Body.Close()
			answers <- answer{s.name, loadtest.StreamCheck{Want: c.want(s.name), Start: start}.Check(resp.Body)}
		}()
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return c.backlog() == int64(len(sent)) }, "the whole backlog queued")
	c.consumer(map[string]string{"WORKER_CONCURRENCY": "1"})
	var got []answer
	for range sent {
		select {
		case a := <-answers:
			if a.rep.Lost || a.rep.Terminal != protocol.EventDone {
				t.Fatalf("%s: %+v", a.name, a.rep)
			}
			got = append(got, a)
		case <-time.After(60 * time.Second):
			t.Fatal("the backlog did not drain within 60 s")
		}
	}
	slices.SortFunc(got, func(a, b answer) int { return cmp.Compare(a.rep.FirstChunk, b.rep.FirstChunk) })
	var order []string
	for _, a := range got {
		order = append(order, a.name)
	}
	if want := []string{"high-1", "high-2", "normal-1", "normal-2", "low-1", "low-2"}; !slices.Equal(order, want) {
		t.Fatalf("start order %v, want %v", order, want)
	}
}
