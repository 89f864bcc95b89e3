package results_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
)

// pipeCounter counts what reaches Redis: single commands and pipelines.
type pipeCounter struct{ single, pipes, piped atomic.Int64 }

func (h *pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.single.Add(1)
		return next(ctx, cmd)
	}
}
func (h *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipes.Add(1)
		h.piped.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// countedPublisher starts a Redis and returns it, a key prefix and a
// Publisher on a client whose commands hook counts.
func countedPublisher(t *testing.T, hook redis.Hook) (*redistest.Server, string, *results.Publisher) {
	t.Helper()
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	rdb := srv.Client(t)
	rdb.AddHook(hook)
	pub, err := results.NewPublisher(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	return srv, prefix, pub
}

// subscribed returns a subscription of its own to channels on srv, every
// one confirmed: whatever is published from now on reaches it.
func subscribed(t *testing.T, srv *redistest.Server, channels []string) *redis.PubSub {
	t.Helper()
	sub := srv.Client(t).Subscribe(t.Context())
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.Subscribe(t.Context(), channels...); err != nil {
		t.Fatal(err)
	}
	for range channels {
		if m, err := sub.Receive(t.Context()); err != nil {
			t.Fatal(err)
		} else if _, ok := m.(*redis.Subscription); !ok {
			t.Fatalf("got %T before the confirmations", m)
		}
	}
	return sub
}

// collect receives n messages on sub in the background. The func it
// returns waits for them, failing the test after 10 s, and gives each
// channel's payloads in the order they arrived.
func collect(t *testing.T, sub *redis.PubSub, n int) func() map[string][]string {
	got := make(map[string][]string)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			msg, err := sub.ReceiveMessage(context.Background())
			if err != nil {
				return
			}
			got[msg.Channel] = append(got[msg.Channel], msg.Payload)
		}
	}()
	return func() map[string][]string {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("not every message arrived within 10s")
		}
		return got
	}
}

// Concurrent publishes share pipelines, each caller gets its own answer
// (heard on a channel with a subscriber, unheard without), every message
// arrives once and in each channel's order; a lone publish is a plain
// call.
func TestConcurrentPublishesSharePipelines(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	hook := &pipeCounter{}
	srv, prefix, pub := countedPublisher(t, hook)
	const workers, each = 32, 50
	var channels []string
	for w := 0; w < workers; w += 2 { // odd workers publish to nobody
		channels = append(channels, failover.ResultChannel(prefix, fmt.Sprint("job-", w)))
	}
	sub := subscribed(t, srv, channels)
	received := collect(t, sub, workers/2*each)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			<-start
			id := fmt.Sprint("job-", w)
			for i := range each {
				heard, err := pub.PublishResult(context.Background(), id, fmt.Appendf(nil, "%d", i))
				if err != nil {
					t.Errorf("worker %d publish %d: %v", w, i, err)
					return
				}
				if heard != (w%2 == 0) {
					t.Errorf("worker %d publish %d: heard %v", w, i, heard)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	got := received()
	for w := 0; w < workers; w += 2 {
		ch := failover.ResultChannel(prefix, fmt.Sprint("job-", w))
		if len(got[ch]) != each {
			t.Fatalf("%s: %d messages, want %d", ch, len(got[ch]), each)
		}
		for i, p := range got[ch] {
			if p != fmt.Sprint(i) {
				t.Fatalf("%s: message %d is %q: out of order", ch, i, p)
			}
		}
	}
	total := int64(workers * each)
	if hook.piped.Load() == 0 || hook.single.Load()+hook.pipes.Load() >= total {
		t.Errorf("%d publishes went out as %d plain calls and %d pipelines (%d in them): none shared",
			total, hook.single.Load(), hook.pipes.Load(), hook.piped.Load())
	}
	t.Logf("%d publishes: %d plain calls, %d pipelines carrying %d", total, hook.single.Load(), hook.pipes.Load(), hook.piped.Load())

	// Alone, a publish is one plain call.
	before := hook.single.Load()
	if _, err := pub.PublishResult(context.Background(), "job-alone", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if hook.single.Load() != before+1 {
		t.Errorf("a lone publish made %d plain calls, want 1", hook.single.Load()-before)
	}
}

// A pipeline whose leader's deadline passes fails for everyone in it, and
// every caller returns: nobody waits for a leader that gave up.
func TestPublishersReturnWhenALeaderTimesOut(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	pub, err := results.NewPublisher(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	if err := admin.Do(t.Context(), "CLIENT", "PAUSE", "500", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if _, err := pub.PublishResult(ctx, fmt.Sprint("slow-", i), []byte("x")); err != nil {
				failed.Add(1)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("publishers still waiting 10s after Redis stalled for 0.5s")
	}
	if failed.Load() == 0 {
		t.Error("no publish failed although Redis stalled past every deadline")
	}
	if _, err := pub.PublishResult(context.Background(), "after", []byte("x")); err != nil {
		t.Fatalf("publish after the stall: %v", err)
	}
}

// mixedPipes records whether a pipeline carried both an EXISTS and a
// PUBLISH.
type mixedPipes struct {
	pipeCounter
	mixed atomic.Bool
}

func (h *mixedPipes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var exists, publish bool
		for _, c := range cmds {
			switch c.Name() {
			case "exists":
				exists = true
			case "publish":
				publish = true
			}
		}
		if exists && publish {
			h.mixed.Store(true)
		}
		return next(ctx, cmds)
	}
}

// A worker's cancel-key check shares the pipelines of concurrent
// publishes, and each caller gets its own answer.
func TestCancelChecksShareThePublishesPipelines(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	rdb := srv.Client(t)
	hook := &mixedPipes{}
	rdb.AddHook(hook)
	pub, err := results.NewPublisher(prefix, rdb)
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	if err := admin.Set(t.Context(), failover.CancelKey(prefix, "gone"), "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	// Redis holds every command for a while: the first caller's call waits
	// in it, and everyone arriving meanwhile goes in the next pipeline.
	if err := admin.Do(t.Context(), "CLIENT", "PAUSE", "500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if _, err := pub.PublishResult(t.Context(), fmt.Sprint("job-", i), []byte("x")); err != nil {
				t.Errorf("publish %d: %v", i, err)
			}
		})
		wg.Go(func() {
			id := "here"
			if i%2 == 0 {
				id = "gone"
			}
			gone, err := pub.Cancelled(t.Context(), id)
			if err != nil || gone != (id == "gone") {
				t.Errorf("Cancelled(%s) = %v, %v", id, gone, err)
			}
		})
	}
	wg.Wait()
	if !hook.mixed.Load() {
		t.Error("no pipeline carried a cancel check with publishes")
	}
}

// A pair (a worker's last batch and DONE) goes out as one pipeline of
// two, in order, heard only when someone listens; pairs from concurrent
// workers share pipelines and each channel still gets its messages in
// order.
func TestPairsGoInOnePipeline(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	hook := &pipeCounter{}
	srv, prefix, pub := countedPublisher(t, hook)
	const workers, each = 16, 20
	var channels []string
	for w := range workers {
		channels = append(channels, failover.ResultChannel(prefix, fmt.Sprint("pair-", w)))
	}
	sub := subscribed(t, srv, channels)
	sink := pub.ResultsFor

	// Nobody listening: unheard, no error. (It also makes the connection
	// the next pair goes on, whose handshake the hook would count.)
	if heard, err := sink("pair-nobody").PublishPair(t.Context(), []byte("a"), []byte("b")); err != nil || heard {
		t.Errorf("pair to a channel nobody listens on: heard %v, %v; want unheard, no error", heard, err)
	}
	// Alone: one pipeline of two, nothing else.
	single, pipes, piped := hook.single.Load(), hook.pipes.Load(), hook.piped.Load()
	heard, err := sink("pair-0").PublishPair(t.Context(), []byte("first"), []byte("second"))
	if err != nil || !heard {
		t.Fatalf("PublishPair: heard %v, %v; want heard", heard, err)
	}
	if d := [3]int64{hook.single.Load() - single, hook.pipes.Load() - pipes, hook.piped.Load() - piped}; d != [3]int64{0, 1, 2} {
		t.Errorf("a lone pair made %d plain calls and %d pipelines carrying %d, want one pipeline of 2", d[0], d[1], d[2])
	}
	for _, want := range []string{"first", "second"} {
		msg, err := sub.ReceiveMessage(t.Context())
		if err != nil || msg.Payload != want {
			t.Fatalf("received %v, %v; want %q", msg, err, want)
		}
	}

	// Concurrent pairs.
	received := collect(t, sub, workers*each*2)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			s := sink(fmt.Sprint("pair-", w))
			for i := range each {
				heard, err := s.PublishPair(context.Background(), fmt.Appendf(nil, "%d-a", i), fmt.Appendf(nil, "%d-b", i))
				if err != nil || !heard {
					t.Errorf("worker %d pair %d: heard %v, %v", w, i, heard, err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := received()
	for _, ch := range channels {
		if len(got[ch]) != 2*each {
			t.Fatalf("%s: %d messages, want %d", ch, len(got[ch]), 2*each)
		}
		for i, p := range got[ch] {
			if want := fmt.Sprintf("%d-%c", i/2, "ab"[i%2]); p != want {
				t.Fatalf("%s: message %d is %q, want %q", ch, i, p, want)
			}
		}
	}
}
