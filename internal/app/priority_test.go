package app

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/loadtest"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testutil"
)

// With a backlog between the low and normal shedding levels, on real
// Redis: a low request is refused with 503 queue-overflow, normal and high
// ones are queued, and once workers drain the backlog every accepted one
// completes.
func TestQueueShedsLowPriorityFirst(t *testing.T) {
	t.Parallel()
	// Threshold 20: low refused from 10, normal from 16, high at 20.
	c := newCluster(t, fastSim(), map[string]string{
		"QUEUE_OVERFLOW_THRESHOLD": "20", "QUEUE_OVERFLOW_HYSTERESIS": "2", "QUEUE_DEPTH_CACHE_TTL_MS": "20",
		"QUEUE_RETRY_AFTER_SECONDS": "7",
	})
	_, url := c.api(map[string]string{"DIRECT_PATH_ENABLED": "false", "PRIORITY_MAX": "high"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type sent struct {
		resp *http.Response
		text string
	}
	var accepted []sent
	for i := range 10 {
		text := "backlog " + strconv.Itoa(i)
		resp := postStream(t, ctx, url, prompt(text), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("backlog request %d: %d", i, resp.StatusCode)
		}
		accepted = append(accepted, sent{resp, text})
	}
	// The gate reads a cached depth: wait until it has read the backlog.
	testutil.Eventually(t, 5*time.Second, func() bool {
		return scrape(t, url+"/metrics", "spillway_queue_depth") >= 10
	}, "the gate reading a backlog of 10")

	refused := postStream(t, ctx, url, prompt("low"), map[string]string{"X-Priority": "low"})
	ra, _ := strconv.Atoi(refused.Header.Get("Retry-After"))
	if refused.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("low priority at a backlog of 10: HTTP %d, want 503", refused.StatusCode)
	}
	if p := readProblem(t, refused); p.Slug() != protocol.ProblemQueueOverflow || ra < 1 || ra > 7 {
		t.Fatalf("low priority refusal %+v Retry-After %d, want queue-overflow within [1, 7]", p, ra)
	}
	for _, prio := range []string{"normal", "high"} {
		resp := postStream(t, ctx, url, prompt(prio), map[string]string{"X-Priority": prio})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s priority at a backlog of 10: HTTP %d, want a queued stream", prio, resp.StatusCode)
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
		rep := loadtest.CheckStream(s.resp.Body, c.want(s.text))
		s.resp.Body.Close()
		if rep.Lost || rep.Terminal != protocol.EventDone {
			t.Fatalf("accepted request %q: %+v", s.text, rep)
		}
	}
	// Drained below low's resume level, low is queued again.
	testutil.Eventually(t, 5*time.Second, func() bool {
		resp := postStream(t, ctx, url, prompt("low after drain"), map[string]string{"X-Priority": "low"})
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && loadtest.CheckStream(resp.Body, nil).Terminal == protocol.EventDone
	}, "low priority accepted after the backlog drained")
}
