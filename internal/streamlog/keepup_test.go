package streamlog_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// The log keeps up with the bench's load (200 streams at once, unpaced,
// 50 chunks each) while Redis answers each write a second late, as a Redis
// busy with the pool's scripts and every other client's commands did at
// 200 concurrent: nothing is dropped, and every log reads back whole and
// in order. (With one write of at most 4,096 events per round trip, the
// appender before issue 31 managed under 4,100 events/s here and dropped
// the rest.)
func TestKeepsUpBehindSlowRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	px := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		"streamlog", "127.0.0.1:0", srv.Addr)
	if err := px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	if _, err := px.Toxics.AddToxicJson(strings.NewReader(
		`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":1000}}`)); err != nil {
		t.Fatal(err)
	}
	slow := redis.NewClient(&redis.Options{Addr: px.Listen})
	t.Cleanup(func() { _ = slow.Close() })
	// The connection's handshake takes its round trips before the load.
	if err := slow.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}

	prefix := redistest.Prefix(t)
	a, err := streamlog.NewAppender(streamlog.Config{Prefix: prefix, TTL: time.Minute}, slow, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	stop := runUntilStopped(a)
	l := load{Streams: 800, Conc: 200, Chunks: 50, Rate: 10_000, ID: func(i int) string { return "keep-" + strconv.Itoa(i) }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	events := l.run(ctx, a)
	stop()
	t.Logf("%d events in %v, %d writes", events, time.Since(start).Round(time.Millisecond), a.Batches())
	if want := int64(l.Streams * (l.Chunks + 2)); events != want {
		t.Fatalf("handed over %d events, want %d", events, want)
	}
	if d := a.Dropped(); d != 0 {
		t.Fatalf("%d of %d entries dropped behind a Redis a second away (%d writes)", d, events, a.Batches())
	}
	r, err := streamlog.NewReader(prefix, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range l.Streams {
		ids := readAll(t, r, l.ID(i))
		if len(ids) != l.Chunks+1 || ids[0] != 1 || ids[len(ids)-1] != int64(l.Chunks+1) {
			t.Fatalf("%s reads back %d events (%s), want 1…%d", l.ID(i), len(ids), fmt.Sprint(ids), l.Chunks+1)
		}
		for j := 1; j < len(ids); j++ {
			if ids[j] != ids[j-1]+1 {
				t.Fatalf("%s: event %d after %d", l.ID(i), ids[j], ids[j-1])
			}
		}
	}
}
