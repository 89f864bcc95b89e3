package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// acceptJobs enqueues n jobs as the api does (protocol.EncodeJob, then
// the Redis Streams producer) and returns their request ids: each one was
// accepted, its XADD acknowledged.
func (s *system) acceptJobs(tb testing.TB, n int) []string {
	tb.Helper()
	q, err := redisstream.New(redisstream.Config{Prefix: queuePrefix, Consumer: "test-producer"}, s.rdb)
	if err != nil {
		tb.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("aof-%03d", i)
		now := time.Now()
		body, err := protocol.EncodeJob(protocol.Job{RequestID: ids[i], UserID: "aof-user", EnqueueTime: now, Deadline: now.Add(time.Minute),
			Payload: protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "kept " + ids[i]}}}})
		if err != nil {
			tb.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = q.Enqueue(ctx, ids[i], body)
		cancel()
		if err != nil {
			tb.Fatalf("enqueue %s: %v", ids[i], err)
		}
	}
	return ids
}

// backlog is the job stream's length (acknowledged entries are deleted).
func (s *system) backlog(tb testing.TB) int64 {
	tb.Helper()
	n, err := s.rdb.XLen(context.Background(), redisstream.StreamKey(queuePrefix)).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestAOFRestartKeepsJobs (scenario 4): Redis with AOF, fsync every second,
// as docker-compose.yml ships it. Jobs accepted before a restart are still
// in the queue after it, and consumer processes started afterwards run
// every one to its whole answer. Without AOF (the control) the same
// restart loses them all, which is what makes the setting necessary.
func TestAOFRestartKeepsJobs(t *testing.T) {
	t.Parallel()
	const jobs = 20
	t.Run("without-aof-lost", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		sys := &system{tb: t, redis: srv}
		sys.rdb = srv.Client(t)
		sys.acceptJobs(t, jobs)
		shutdownNoSave(t, srv)
		if n := sys.backlog(t); n != 0 {
			t.Fatalf("backlog %d after a restart without persistence, want 0: the control does not lose jobs", n)
		}
	})
	t.Run("aof-kept", func(t *testing.T) {
		t.Parallel()
		srv := redistest.StartWith(t, "--appendonly", "yes", "--appendfsync", "everysec")
		sys := newSystem(t, srv, answer{tokens: 30, interval: 10 * time.Millisecond, seed: 41}, map[string]string{
			"CONNECTION_POOL_SIZE": "8", "CONNECTION_POOL_PER_USER": "8", "WORKER_CONCURRENCY": "8",
		})
		ids := sys.acceptJobs(t, jobs)
		shutdownNoSave(t, srv)
		kept := sys.backlog(t)
		if kept != jobs {
			t.Fatalf("backlog %d after the restart, want the %d accepted jobs", kept, jobs)
		}

		// Listen on every job's channel, then let consumers run them.
		sub, err := results.NewSubscriber(results.SubscriberConfig{Prefix: queuePrefix}, sys.rdb, testutil.DiscardLogger())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
		defer cancel()
		outcomes := make([]string, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			s, err := sub.SubscribeResults(ctx, id)
			if err != nil {
				t.Fatalf("subscribe %s: %v", id, err)
			}
			wg.Go(func() {
				defer s.Close()
				outcomes[i] = sys.readAnswer(ctx, s.C(), "kept "+id)
			})
		}
		sys.consumer(nil)
		sys.consumer(nil)
		wg.Wait()
		tally := map[string]int{}
		for i, o := range outcomes {
			tally[o]++
			if o != "done" {
				t.Errorf("job %s: %s", ids[i], o)
			}
		}
		testutil.Eventually(t, 10*time.Second, func() bool { return sys.backlog(t) == 0 }, "every job acknowledged")
		var f figures
		f.add("accepted", jobs)
		f.add("kept_after_restart", kept)
		f.add("outcomes", tally)
		f.add("lost", jobs-tally["done"])
		f.log(t, "aof-restart")
	})
}

// readAnswer reads one job's result channel as the api's relay would
// (fenced; the chunks after the last reset) until the end, and says how it
// ended: "done" with the whole answer to text, or what went wrong.
func (s *system) readAnswer(ctx context.Context, c <-chan []byte, text string) string {
	var got []string
	for {
		select {
		case <-ctx.Done():
			return fmt.Sprintf("no end: %d chunks", len(got))
		case msg, ok := <-c:
			if !ok {
				return "subscription ended"
			}
			r, err := protocol.DecodeResult(msg)
			if err != nil {
				return "malformed: " + err.Error()
			}
			switch r.Kind {
			case protocol.KindReset:
				got = got[:0]
			case protocol.KindBatch:
				for _, ch := range r.Chunks {
					if ch.Seq != len(got)+1 {
						return fmt.Sprintf("seq %d after %d", ch.Seq, len(got))
					}
					got = append(got, ch.Content)
				}
			case protocol.KindError:
				return "error " + r.Problem.Slug()
			case protocol.KindDone:
				if strings.Join(got, "") != strings.Join(s.want(text), "") {
					return fmt.Sprintf("done with a different answer (%d chunks)", len(got))
				}
				return "done"
			}
		}
	}
}
