package faults

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// report logs a scenario's figures in the form docs/RELIABILITY.md shows.
func report(t *testing.T, name string, os []outcome, lost int) {
	resets := 0
	for _, o := range os {
		resets += o.resets
	}
	t.Logf("FIGURES %s: streams=%d outcomes=%v resets=%d lost=%d", name, len(os), tally(os), resets, lost)
}

// faultAt is a once-only trigger: the fault starts when some stream has
// received n chunks (the "1 s after the first chunk", scaled).
type faultAt struct {
	n    int
	once sync.Once
	do   func()
}

func (f *faultAt) onChunk(got int) {
	if got >= f.n {
		f.once.Do(f.do)
	}
}

// TestPublishFaultClientPause (scenario 1a): Redis refuses writes (CLIENT
// PAUSE … WRITE, longer than the publish budget) while answers stream.
// Every stream is whole or ends in an explicit error; never a done with
// chunks missing.
func TestPublishFaultClientPause(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.startWorker("c1", r.srv.Addr)
	admin := r.client(r.srv.Addr)
	pause := 2 * publishBudget
	errs := make(chan error, 1)
	f := &faultAt{n: 10, do: func() {
		errs <- admin.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err()
	}}
	os := r.parallel(8, f.onChunk)
	if err := <-errs; err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	lost := checkWhole(t, os)
	report(t, "client-pause", os, lost)
	if tally(os)["done"] == 0 {
		t.Errorf("no stream completed: %v", tally(os))
	}
}

// TestPublishFaultLatency (scenario 1b): toxiproxy adds latency above the
// publish budget on the worker's link to Redis for three budgets.
func TestPublishFaultLatency(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	p := r.proxy("worker-latency")
	r.startWorker("c1", p.Listen)
	errs := make(chan error, 1)
	f := &faultAt{n: 10, do: func() {
		_, err := p.Toxics.AddToxicJson(strings.NewReader(
			`{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":1200}}`))
		errs <- err
		time.AfterFunc(3*publishBudget, func() { _ = p.Toxics.RemoveToxic(context.Background(), "lat") })
	}}
	os := r.parallel(8, f.onChunk)
	if err := <-errs; err != nil {
		t.Fatalf("add latency toxic: %v", err)
	}
	lost := checkWhole(t, os)
	report(t, "latency", os, lost)
}

// TestSplitBrainWorker (scenario 2): consumer 1's link to Redis is cut
// after two chunks for reclaim + 2 heartbeats, then restored; consumer 2
// takes the job over. The client gets exactly one reset, one terminal
// event, the whole answer from attempt 2, and nothing of attempt 1 after
// the reset.
func TestSplitBrainWorker(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	p := r.proxy("consumer-1")
	// Only consumer 1 runs until the cut, so that it takes the job.
	r.startWorker("c1", p.Listen)
	restored := make(chan struct{})
	f := &faultAt{n: 2, do: func() {
		for _, dir := range []string{"downstream", "upstream"} {
			// timeout 0 holds the data: a partition, not a reset.
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(
				`{"name":"cut-` + dir + `","type":"timeout","stream":"` + dir + `","attributes":{"timeout":0}}`)); err != nil {
				t.Errorf("cut %s: %v", dir, err)
			}
		}
		r.startWorker("c2", r.srv.Addr)
		time.AfterFunc(reclaimIdle+2*heartbeat, func() {
			defer close(restored)
			for _, dir := range []string{"downstream", "upstream"} {
				_ = p.Toxics.RemoveToxic(context.Background(), "cut-"+dir)
			}
		})
	}}
	id := "split-1"
	o := r.stream(id, f.onChunk)
	<-restored
	lost := checkWhole(t, []outcome{o})
	report(t, "split-brain", []outcome{o}, lost)
	if o.end != "done" || o.resets != 1 || o.terminals != 1 {
		t.Fatalf("stream ended %q after %d resets and %d terminal events; want done, one reset, one terminal", o.end, o.resets, o.terminals)
	}
	for _, a := range o.attempts {
		if a != 2 {
			t.Errorf("after the reset a batch of attempt %d reached the client; want only attempt 2", a)
		}
	}
	if o.answer != reference(id) {
		t.Errorf("final answer differs from the reference")
	}
}
