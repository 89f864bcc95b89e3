package faults

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestRedisPasswordRotation (issue 29): Redis's requirepass changes under
// a running api and consumer, and every connection is dropped, so each
// must dial again and is refused (WRONGPASS). The api keeps running: its
// readiness says not ready and a new request gets a clean refusal; the
// consumer logs WRONGPASS and keeps running. Once the password matches
// again both recover: the api is ready and answers, queued answers too.
func TestRedisPasswordRotation(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	admin := func(password string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: password, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	if err := admin("").ConfigSet(ctx, "requirepass", "old").Err(); err != nil {
		t.Fatal(err)
	}
	sys := newSystem(t, srv, answer{tokens: 10, interval: 20 * time.Millisecond, seed: 61}, map[string]string{
		"REDIS_URL": "redis://:old@" + srv.Addr, "CONNECTION_POOL_SIZE": "4", "WORKER_CONCURRENCY": "4",
	})
	sys.rdb = admin("old")
	api := sys.api(nil)
	consumer := sys.consumer(nil)
	answered := func(what string) {
		t.Helper()
		cs := sys.open(ctx, api.URL(), what, "alice", 0)
		waitAll(t, []*clientStream{cs}, 20*time.Second)
		if cs.outcome() != "done" {
			t.Fatalf("%s: %s", what, cs.outcome())
		}
	}
	answered("before the rotation")

	rotated := time.Now()
	if err := admin("old").ConfigSet(ctx, "requirepass", "new").Err(); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"normal", "pubsub"} {
		if err := admin("new").Do(ctx, "CLIENT", "KILL", "TYPE", typ, "SKIPME", "yes").Err(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return status(ctx, api.URL()+"/readyz") == http.StatusServiceUnavailable },
		"the api reports not ready")
	// A request meanwhile is refused cleanly (a problem document).
	cs := sys.open(ctx, api.URL(), "during the rotation", "bob", 0)
	waitAll(t, []*clientStream{cs}, 20*time.Second)
	refusal := cs.outcome()
	if cs.status != http.StatusServiceUnavailable || cs.problem == "" {
		t.Errorf("a request with Redis refusing the password: %s (status %d), want a 503 problem", refusal, cs.status)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return len(consumer.mentions("WRONGPASS")) > 0 },
		"the consumer logs WRONGPASS")
	// Both keep running for a while: the api used to crash within 3 s.
	hold(t, ctx, 5*time.Second)
	for _, p := range []*proc{api, consumer} {
		select {
		case <-p.exited:
			t.Fatalf("%s exited with the password rotated:\n%s", p.name, p.tail(40))
		default:
		}
	}
	if n := len(api.mentions("panic")); n > 0 {
		t.Errorf("the api logged %d panics", n)
	}

	if err := admin("new").ConfigSet(ctx, "requirepass", "old").Err(); err != nil {
		t.Fatal(err)
	}
	restored := time.Now()
	testutil.Eventually(t, 30*time.Second, func() bool { return status(ctx, api.URL()+"/readyz") == http.StatusOK },
		"the api ready again")
	readyAfter := time.Since(restored)
	answered("after the password matches again")
	// A queued answer too: the consumer is back.
	var queued *clientStream
	css := make([]*clientStream, 8)
	for i := range css {
		css[i] = sys.open(ctx, api.URL(), "after, queued "+strings.Repeat("x", i), "carol", 0)
	}
	waitAll(t, css, 30*time.Second)
	for _, c := range css {
		if c.outcome() != "done" {
			t.Errorf("after the restore: %s ended %s", c.path, c.outcome())
		}
		if c.path == "queued" {
			queued = c
		}
	}
	if queued == nil {
		t.Errorf("no request of 8 on a pool of 4 was queued: %v", tallyStreams(css))
	}
	var f figures
	f.add("refusal_during_rotation", refusal)
	f.add("consumer_wrongpass_lines", len(consumer.mentions("WRONGPASS")))
	f.add("rotated_for", restored.Sub(rotated))
	f.add("ready_after_restore", readyAfter)
	f.add("after_restore", tallyStreams(css))
	f.log(t, "password-rotation")
}

// status returns the HTTP status of a GET of url, 0 when it failed.
func status(ctx context.Context, url string) int {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
