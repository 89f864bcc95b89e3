package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/failover/gateway"
	"github.com/spillway-dev/spillway/internal/failover/redisstream"
	"github.com/spillway-dev/spillway/internal/failover/results"
	"github.com/spillway-dev/spillway/internal/failover/worker"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Short settings: every scenario runs in a few seconds. The ratios are the
// production ones: reclaim well above a heartbeat, the publish budget
// below the faults injected.
const (
	heartbeat     = 200 * time.Millisecond
	reclaimIdle   = 2 * time.Second
	publishBudget = 600 * time.Millisecond
	queueTimeout  = 5 * time.Second
	tokenInterval = 40 * time.Millisecond
	tokens        = 30
	seed          = 11
)

// rig is one scenario's Redis, api side (gateway) and workers.
type rig struct {
	tb     testing.TB
	srv    *redistest.Server
	prefix string
	gw     *gateway.Gateway
}

func newRig(tb testing.TB) *rig {
	tb.Helper()
	r := &rig{tb: tb, srv: redistest.Start(tb), prefix: redistest.Prefix(tb)}
	rdb := r.client(r.srv.Addr)
	q := r.queue(rdb, "api")
	sub, err := results.NewSubscriber(results.SubscriberConfig{Prefix: r.prefix}, rdb, testutil.DiscardLogger())
	if err != nil {
		tb.Fatalf("results.NewSubscriber: %v", err)
	}
	tb.Cleanup(func() { _ = sub.Close() })
	r.gw, err = gateway.New(gateway.Config{QueueTimeout: queueTimeout, WorkerHeartbeat: heartbeat, ReclaimIdle: reclaimIdle},
		gateway.Deps{Producer: q, Results: sub, Canceller: sub, Log: testutil.DiscardLogger()})
	if err != nil {
		tb.Fatalf("gateway.New: %v", err)
	}
	return r
}

// client is a Redis client as the processes build it: context deadlines
// bound every command.
func (r *rig) client(addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond})
	r.tb.Cleanup(func() { _ = c.Close() })
	return c
}

func (r *rig) queue(rdb redis.UniversalClient, member string) *redisstream.Queue {
	q, err := redisstream.New(redisstream.Config{Prefix: r.prefix, Consumer: member, ReclaimIdle: reclaimIdle}, rdb)
	if err != nil {
		r.tb.Fatalf("redisstream.New: %v", err)
	}
	return q
}

// proxy starts a toxiproxy link to Redis, for a worker to use.
func (r *rig) proxy(name string) *toxiproxy.Proxy {
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", r.srv.Addr)
	if err := p.Start(); err != nil {
		r.tb.Fatalf("toxiproxy start: %v", err)
	}
	r.tb.Cleanup(p.Stop)
	return p
}

// startWorker runs a consumer process's worker named member, talking to
// Redis at addr, until the test ends.
func (r *rig) startWorker(member, addr string) {
	rdb := r.client(addr)
	pub, err := results.NewPublisher(r.prefix, rdb)
	if err != nil {
		r.tb.Fatalf("results.NewPublisher: %v", err)
	}
	sim, err := llm.NewSim(llm.SimConfig{FirstToken: 10 * time.Millisecond, TokenInterval: tokenInterval, Tokens: tokens, Seed: seed})
	if err != nil {
		r.tb.Fatalf("llm.NewSim: %v", err)
	}
	p, err := pool.NewLocal(64, 64)
	if err != nil {
		r.tb.Fatalf("pool.NewLocal: %v", err)
	}
	w, err := worker.New(worker.Config{
		Concurrency: 16, Heartbeat: heartbeat, BatchSize: 4, BatchTimeout: 50 * time.Millisecond,
		MaxRetries: 1, Retry: llm.RetryPolicy{BaseDelay: 50 * time.Millisecond, MaxDelay: 100 * time.Millisecond},
		QueueTimeout: queueTimeout, StopGrace: time.Second, ReclaimIdle: reclaimIdle, PublishBudget: publishBudget,
	}, worker.Deps{Consumer: r.queue(rdb, member), Pool: p, Provider: sim, Results: pub, Cancels: pub,
		Log: testutil.DiscardLogger()})
	if err != nil {
		r.tb.Fatalf("worker.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx)
	}()
	r.tb.Cleanup(func() { cancel(); <-done })
}

// outcome is what one client saw, read as the HTTP handler reads the relay.
type outcome struct {
	id        string
	answer    string // the chunks after the last reset
	chunks    int    // chunks after the last reset
	resets    int
	terminals int
	end       string // "done" or the problem slug
	attempts  []int  // attempt of every batch after the last reset
}

func newJob(id string) protocol.Job {
	return protocol.Job{RequestID: id, UserID: "user-" + id,
		Payload: protocol.ChatRequest{Messages: []protocol.Message{{Role: "user", Content: "tell me about " + id}}}}
}

// reference is the whole answer a job should get.
func reference(id string) string {
	return strings.Join(llm.SimChunks(newJob(id).Payload.Messages, seed, tokens), "")
}

// stream spills one job and reads its relay to the end. onChunk, when not
// nil, is called with the number of chunks received so far (resets
// included) after each batch.
func (r *rig) stream(id string, onChunk func(n int)) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := outcome{id: id}
	rel, err := r.gw.Spill(ctx, newJob(id))
	if err != nil {
		o.end, o.terminals = "spill: "+err.Error(), 1
		return o
	}
	completed := false
	defer func() { rel.Close(completed) }()
	var b strings.Builder
	received := 0
	for {
		select {
		case res := <-rel.Results():
			switch res.Kind {
			case protocol.KindBatch:
				for _, c := range res.Chunks {
					if c.Seq != o.chunks+1 {
						o.end = fmt.Sprintf("seq %d after %d", c.Seq, o.chunks)
						o.terminals++
						return o
					}
					o.chunks++
					b.WriteString(c.Content)
				}
				o.attempts = append(o.attempts, res.Attempt)
				received += len(res.Chunks)
				if onChunk != nil {
					onChunk(received)
				}
			case protocol.KindReset:
				o.resets++
				o.chunks, o.attempts = 0, nil
				b.Reset()
			case protocol.KindDone:
				o.terminals++
				o.end, o.answer, completed = "done", b.String(), true
				return o
			case protocol.KindError:
				o.terminals++
				o.end, o.answer = res.Problem.Slug(), b.String()
				return o
			}
		case <-rel.Done():
			o.terminals++
			o.end, o.answer = rel.Problem().Slug(), b.String()
			return o
		case <-ctx.Done():
			o.end = "no terminal event within 30s"
			return o
		}
	}
}

// tally counts outcomes by end for the report.
func tally(os []outcome) map[string]int {
	m := map[string]int{}
	for _, o := range os {
		m[o.end]++
	}
	return m
}

// checkWhole fails for a stream that ended in done without the whole
// answer, or without exactly one terminal event; it returns the number
// of such streams (lost).
func checkWhole(tb testing.TB, os []outcome) int {
	tb.Helper()
	lost := 0
	for _, o := range os {
		switch {
		case o.terminals != 1:
			tb.Errorf("%s: %d terminal events (%s)", o.id, o.terminals, o.end)
			lost++
		case o.end == "done" && o.answer != reference(o.id):
			tb.Errorf("%s: done with %d chunks, answer differs from the reference", o.id, o.chunks)
			lost++
		case o.end != "done" && o.end != protocol.ProblemStreamGap && o.end != protocol.ProblemWorkerLost &&
			o.end != protocol.ProblemProviderError && o.end != protocol.ProblemQueueUnavailable:
			tb.Errorf("%s: ended with %q, neither done nor an explicit error", o.id, o.end)
			lost++
		}
	}
	return lost
}

// parallel runs n streams at once and returns their outcomes.
func (r *rig) parallel(n int, onChunk func(int)) []outcome {
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = r.stream(fmt.Sprintf("s%03d", i), onChunk) })
	}
	wg.Wait()
	return out
}

var _ failover.Consumer = (*redisstream.Queue)(nil)
