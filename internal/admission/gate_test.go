package admission

import (
	"context"
	"net/http"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// backlog is a Backlog that can also tell the jobs no worker has taken.
type backlog struct{ depth, waiting int64 }

func (b backlog) Depth(context.Context) (int64, error)   { return b.depth, nil }
func (b backlog) Waiting(context.Context) (int64, error) { return b.waiting, nil }

type capacity int

func (c capacity) Stats() pool.Stats { return pool.Stats{Capacity: int(c)} }

// usage is a pool of Capacity slots with InUse of them taken.
type usage pool.Stats

func (u usage) Stats() pool.Stats { return pool.Stats(u) }

func newGateOver(tb testing.TB, b Backlog) *Gate {
	tb.Helper()
	return newGateOverPool(tb, b, usage{InUse: 4, Capacity: 4})
}

func newGateOverPool(tb testing.TB, b Backlog, p interface{ Stats() pool.Stats }) *Gate {
	tb.Helper()
	o, err := NewOverflow(OverflowConfig{Threshold: 10, Hysteresis: 2}, b, newMetrics(tb), testutil.DiscardLogger())
	if err != nil {
		tb.Fatal(err)
	}
	o.refresh(context.Background(), time.Now())
	svc, err := NewServiceTime(time.Second, time.Minute)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := NewGate(GateDeps{Overflow: o, Service: svc, Pool: p})
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// QueueFirst follows the jobs no worker has taken when the backlog can
// tell them apart, the whole backlog otherwise; MayQueue follows the
// overflow threshold.
func TestGateQueueFirstAndMayQueue(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		b          Backlog
		queueFirst bool
		overflow   bool
	}{
		{"jobs all taken", backlog{depth: 5, waiting: 0}, false, false},
		{"jobs waiting", backlog{depth: 5, waiting: 2}, true, false},
		{"over threshold", backlog{depth: 10, waiting: 10}, true, true},
		{"depth only", DepthFunc(func(context.Context) (int64, error) { return 3, nil }), true, false},
		{"depth only, empty", DepthFunc(func(context.Context) (int64, error) { return 0, nil }), false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g := newGateOver(t, tt.b)
			if got := g.QueueFirst(); got != tt.queueFirst {
				t.Errorf("QueueFirst = %v, want %v", got, tt.queueFirst)
			}
			p := g.MayQueue(protocol.PriorityHigh)
			if (p != nil) != tt.overflow || (p != nil && p.Slug() != protocol.ProblemQueueOverflow) {
				t.Errorf("MayQueue = %+v, want refusal %v", p, tt.overflow)
			}
		})
	}
}

// Jobs no worker has taken send new requests behind them only while the
// pool is full: with slots free they wait for a worker or behind their
// own identity's limit, and other identities' requests go direct.
func TestGateQueueFirstOnlyWhileThePoolIsFull(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		inUse int
		want  bool
	}{{0, false}, {3, false}, {4, true}, {5, true}} {
		g := newGateOverPool(t, backlog{depth: 5, waiting: 2}, usage{InUse: tt.inUse, Capacity: 4})
		if got := g.QueueFirst(); got != tt.want {
			t.Errorf("%d of 4 slots in use, jobs waiting: QueueFirst = %v, want %v", tt.inUse, got, tt.want)
		}
	}
}

// Without a queue, rate limit or breaker the gate admits everything and
// advises the service-time estimate for a full pool.
func TestGateWithoutQueue(t *testing.T) {
	t.Parallel()
	svc, err := NewServiceTime(2*time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGate(GateDeps{Service: svc, Pool: capacity(1)})
	if err != nil {
		t.Fatal(err)
	}
	if p := g.Admit(context.Background(), "u", protocol.PriorityNormal); p != nil {
		t.Errorf("Admit = %+v", p)
	}
	if g.MayQueue(protocol.PriorityHigh) != nil || g.QueueFirst() {
		t.Error("a gate without a queue refuses or queues first")
	}
	if d := g.RetryAfter(); d <= 0 {
		t.Errorf("RetryAfter = %v, want an estimate", d)
	}
	if _, err := NewGate(GateDeps{}); err == nil {
		t.Error("NewGate without service time and pool succeeded")
	}
}

// openCircuit is a Circuit open for left.
type openCircuit struct{ left *time.Duration }

func (c openCircuit) OpenFor() time.Duration { return *c.left }

// While the provider's circuit is open the gate refuses with 503
// provider-unavailable, Retry-After the time left rounded up to whole
// seconds, and counts each refusal; once the circuit takes calls, it
// admits.
func TestGateRefusesWhileCircuitOpen(t *testing.T) {
	t.Parallel()
	left := 10 * time.Second
	m := newMetrics(t)
	svc, err := NewServiceTime(time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewGate(GateDeps{Circuit: openCircuit{&left}, Service: svc, Pool: capacity(1)}); err == nil {
		t.Fatal("NewGate with a circuit and no metrics: want an error")
	}
	g, err := NewGate(GateDeps{Circuit: openCircuit{&left}, Metrics: m, Service: svc, Pool: capacity(1)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		left      time.Duration
		wantRetry int
	}{{10 * time.Second, 10}, {6 * time.Second, 6}, {500 * time.Millisecond, 1}} {
		left = tt.left
		p := g.Admit(t.Context(), "alice", protocol.PriorityHigh)
		if p == nil {
			t.Fatalf("open for %v: admitted", tt.left)
		}
		if p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemProviderUnavailable || p.RetryAfterSeconds != tt.wantRetry {
			t.Fatalf("open for %v: %d %q retry %d, want 503 %q retry %d", tt.left, p.Status, p.Slug(), p.RetryAfterSeconds,
				protocol.ProblemProviderUnavailable, tt.wantRetry)
		}
	}
	if got := promtest.ToFloat64(m.QueueRejections.WithLabelValues("circuit_open", "high")); got != 3 {
		t.Fatalf("circuit_open rejections = %v, want 3", got)
	}
	left = 0
	if p := g.Admit(t.Context(), "alice", protocol.PriorityHigh); p != nil {
		t.Fatalf("circuit taking calls: refused %+v", p)
	}
}
