package admission

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

type fakeSignals struct {
	mu sync.Mutex
	s  DegradeSignals
}

func (f *fakeSignals) Signals() DegradeSignals {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.s
}

func (f *fakeSignals) set(s DegradeSignals) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s = s
}

func TestLevelOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s    DegradeSignals
		want int
	}{
		{DegradeSignals{}, 0},
		{DegradeSignals{BacklogFraction: 0.09, QueueWaitP99: 4 * time.Second, ErrorRate: 0.04, HeapFraction: 0.69}, 0},
		{DegradeSignals{BacklogFraction: 0.10}, 1},
		{DegradeSignals{BacklogFraction: 0.50}, 2},
		{DegradeSignals{BacklogFraction: 0.80}, 3},
		{DegradeSignals{QueueWaitP99: 5 * time.Second}, 1},
		{DegradeSignals{QueueWaitP99: 15 * time.Second}, 2},
		{DegradeSignals{QueueWaitP99: 25 * time.Second}, 3},
		// The failure rate does not act at once (Degrader.errorLevel).
		{DegradeSignals{ErrorRate: 0.50, Requests: 1000}, 0},
		{DegradeSignals{HeapFraction: 0.70}, 1},
		{DegradeSignals{HeapFraction: 0.80}, 2},
		{DegradeSignals{HeapFraction: 0.90}, 3},
		// The highest input wins.
		{DegradeSignals{BacklogFraction: 0.2, QueueWaitP99: 26 * time.Second}, 3},
	}
	for _, tt := range tests {
		if got := levelOf(tt.s); got != tt.want {
			t.Errorf("levelOf(%+v) = %d, want %d", tt.s, got, tt.want)
		}
	}
}

// runDegrader runs d on the fake clock of the synctest bubble and returns
// a function that waits n seconds and reports the gauge.
func runDegrader(t *testing.T, d *Degrader) func(n int) int {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go d.Run(ctx)
	return func(n int) int {
		time.Sleep(time.Duration(n)*time.Second + time.Millisecond)
		synctest.Wait()
		return int(promtest.ToFloat64(d.gauge))
	}
}

func checkLevel(t *testing.T, step string, got, want int) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: level %d, want %d", step, got, want)
	}
}

// Each level is entered at once and left only after DegradeHold below it,
// on the fake clock of testing/synctest; the gauge follows.
func TestDegraderHysteresis(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		in := &fakeSignals{}
		d, err := NewDegrader(DegradeConfig{}, in, newMetrics(t), testutil.DiscardLogger())
		if err != nil {
			t.Fatal(err)
		}
		after := runDegrader(t, d)
		checkLevel(t, "idle", after(1), 0)
		for lvl, backlog := range []float64{0.1, 0.5, 0.8} {
			in.set(DegradeSignals{BacklogFraction: backlog})
			checkLevel(t, "entering", after(1), lvl+1)
		}
		// Below level 3 (at level 1's signals): held at 3 for 30 s.
		in.set(DegradeSignals{BacklogFraction: 0.2})
		checkLevel(t, "just below 3", after(1), 3)
		checkLevel(t, "below 3 for 28 s", after(27), 3)
		// A spike back to 3 restarts the hold.
		in.set(DegradeSignals{QueueWaitP99: 30 * time.Second})
		checkLevel(t, "spike", after(1), 3)
		in.set(DegradeSignals{BacklogFraction: 0.2})
		checkLevel(t, "below again 29 s", after(29), 3)
		checkLevel(t, "below 3 for the hold", after(2), 1)
		// Back to normal: level 1 is held too, then left.
		in.set(DegradeSignals{})
		checkLevel(t, "below 1 for 10 s", after(10), 1)
		checkLevel(t, "below 1 for the hold", after(21), 0)
		if d.Level() != 0 {
			t.Errorf("Level() = %d, want 0", d.Level())
		}
	})
}

// Falling from 3 passes through 2 when the signals were at 2 more
// recently than at 3: each level keeps its own hold.
func TestDegraderLeavesOneLevelAtATime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		in := &fakeSignals{}
		d, err := NewDegrader(DegradeConfig{Hold: 30 * time.Second}, in, newMetrics(t), testutil.DiscardLogger())
		if err != nil {
			t.Fatal(err)
		}
		after := runDegrader(t, d)
		in.set(DegradeSignals{HeapFraction: 0.95})
		checkLevel(t, "critical", after(1), 3)
		in.set(DegradeSignals{HeapFraction: 0.85})
		checkLevel(t, "at 2's signals for 20 s", after(20), 3)
		in.set(DegradeSignals{})
		checkLevel(t, "below everything, 3 not yet held out", after(9), 3)
		checkLevel(t, "3 held out, 2 seen 11 s ago", after(2), 2)
		checkLevel(t, "2 seen 29 s ago", after(18), 2)
		checkLevel(t, "2 held out, 1 too (seen with 2)", after(2), 0)
	})
}

// The effects of each level: what Check refuses and what MaxTokens caps,
// and the refusals counted by priority.
func TestDegraderEffects(t *testing.T) {
	t.Parallel()
	in := &fakeSignals{}
	m := newMetrics(t)
	d, err := NewDegrader(DegradeConfig{MaxTokens: 256, RetryAfterMax: 20 * time.Second}, in, m, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	type effect struct {
		refused bool
		cap     int
	}
	levels := []struct {
		signals DegradeSignals
		want    map[protocol.Priority]effect
	}{
		{DegradeSignals{}, map[protocol.Priority]effect{"low": {}, "normal": {}, "high": {}, "": {}}},
		{DegradeSignals{BacklogFraction: 0.1}, map[protocol.Priority]effect{"low": {}, "normal": {}, "high": {}}},
		{DegradeSignals{BacklogFraction: 0.5}, map[protocol.Priority]effect{"low": {refused: true}, "normal": {cap: 256}, "high": {}, "": {cap: 256}}},
		// Normal is refused at 3 (the probes aside, one in ten); its cap
		// would apply, were it not.
		{DegradeSignals{BacklogFraction: 0.8}, map[protocol.Priority]effect{"low": {refused: true}, "normal": {refused: true, cap: 256}, "high": {}, "": {refused: true, cap: 256}}},
	}
	now := time.Now()
	for lvl, l := range levels {
		in.set(l.signals)
		if got := d.Step(now); got != lvl {
			t.Fatalf("level %d signals gave level %d", lvl, got)
		}
		for prio, want := range l.want {
			p := d.Check(prio)
			if (p != nil) != want.refused {
				t.Errorf("level %d, priority %q: refusal %+v, want refused %v", lvl, prio, p, want.refused)
			}
			if p != nil && (p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemQueueOverflow || p.RetryAfterSeconds != 20) {
				t.Errorf("level %d, priority %q: refusal %+v, want 503 queue-overflow advising 20 s", lvl, prio, p)
			}
			if got := d.MaxTokens(prio); got != want.cap {
				t.Errorf("level %d, priority %q: max tokens cap %d, want %d", lvl, prio, got, want.cap)
			}
		}
	}
	// Refused at level 2: low; at level 3: low, normal and the empty
	// priority (normal).
	for prio, want := range map[string]float64{"low": 2, "normal": 2, "high": 0} {
		if got := promtest.ToFloat64(m.QueueRejections.WithLabelValues(ReasonDegraded, prio)); got != want {
			t.Errorf("degraded rejections of %s: %v, want %v", prio, got, want)
		}
	}
}

// The gate applies the degrader after its other checks.
func TestGateDegrades(t *testing.T) {
	t.Parallel()
	in := &fakeSignals{}
	d, err := NewDegrader(DegradeConfig{}, in, newMetrics(t), testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	svc, err := NewServiceTime(time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGate(GateDeps{Degrader: d, Service: svc, Pool: capacity(4)})
	if err != nil {
		t.Fatal(err)
	}
	in.set(DegradeSignals{BacklogFraction: 0.6})
	d.Step(time.Now())
	if p := g.Admit(t.Context(), "u", protocol.PriorityLow); p == nil || p.Slug() != protocol.ProblemQueueOverflow {
		t.Errorf("low at level 2 admitted: %+v", p)
	}
	if p := g.Admit(t.Context(), "u", protocol.PriorityNormal); p != nil {
		t.Errorf("normal at level 2 refused: %+v", p)
	}
	if got := g.MaxTokens(protocol.PriorityNormal); got != DefaultDegradeMaxTokens {
		t.Errorf("normal cap at level 2: %d, want %d", got, DefaultDegradeMaxTokens)
	}
}

func TestDegradeConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []DegradeConfig{{MaxTokens: -1}, {Hold: -time.Second}, {RetryAfterMax: time.Millisecond},
		{MinRequests: -1}, {ProbeEvery: -1}, {RaiseAfter: -time.Second}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := NewDegrader(DegradeConfig{}, nil, nil, nil); err == nil {
		t.Error("a degrader without inputs was built")
	}
}

// Sources reads the overflow gate's backlog and Recent's figures.
func TestSourcesSignals(t *testing.T) {
	t.Parallel()
	depth := &fakeDepth{}
	depth.set(250, nil)
	o, err := NewOverflow(OverflowConfig{Threshold: 1000}, DepthFunc(depth.read), newMetrics(t), testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	o.refresh(t.Context(), time.Now())
	s := Sources{Overflow: o, Heap: func() float64 { return 0.85 }}.Signals()
	if s.BacklogFraction != 0.25 || s.HeapFraction != 0.85 || s.QueueWaitP99 != 0 || s.ErrorRate != 0 {
		t.Errorf("signals %+v, want backlog 0.25 and heap 0.85", s)
	}
	if levelOf(s) != 2 {
		t.Errorf("level of %+v: %d, want 2", s, levelOf(s))
	}
}

// The failure rate raises a level only with MinRequests ended requests
// behind it and after holding at or above the threshold for RaiseAfter;
// a dip restarts that clock; alone it stops at level 2, and reaches 3
// only beside another critical input; once its latest seconds are clean
// it holds no level, however the minute reads. The log line names the
// input.
func TestDegraderFailureRate(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		in := &fakeSignals{}
		log, logs := testutil.NewLog(t)
		m := newMetrics(t)
		d, err := NewDegrader(DegradeConfig{}, in, m, log)
		if err != nil {
			t.Fatal(err)
		}
		after := runDegrader(t, d)
		// One failed request of one, a minute long: nothing.
		in.set(DegradeSignals{ErrorRate: 1, LatestErrorRate: 1, Requests: 1})
		checkLevel(t, "1 of 1 failed", after(60), 0)
		in.set(DegradeSignals{ErrorRate: 1, LatestErrorRate: 1, Requests: DefaultDegradeMinRequests - 1})
		checkLevel(t, "19 of 19 failed", after(30), 0)
		// 30 % of 40: level 2, but only after 10 s.
		in.set(DegradeSignals{ErrorRate: 0.3, LatestErrorRate: 0.3, Requests: 40})
		checkLevel(t, "30 % for 9 s", after(9), 0)
		in.set(DegradeSignals{ErrorRate: 0.04, LatestErrorRate: 0.04, Requests: 40})
		checkLevel(t, "a dip", after(1), 0)
		in.set(DegradeSignals{ErrorRate: 0.3, LatestErrorRate: 0.3, Requests: 40})
		// The first sample at 30 % starts the clock: ten samples later it
		// has held for 9 s, eleven for 10 s.
		checkLevel(t, "30 % again, held 9 s", after(10), 0)
		checkLevel(t, "30 % held 10 s", after(1), 2)
		if logs.Count("input=error_rate") != 1 || logs.Count("requests=40") != 1 {
			t.Errorf("level change logged as %q; want the input and its figures named", logs.String())
		}
		if got := promtest.ToFloat64(m.DegradationInput.WithLabelValues(InputErrorRate)); got != 0.3 {
			t.Errorf("error_rate input gauge %v, want 0.3", got)
		}
		if got := promtest.ToFloat64(m.DegradationInput.WithLabelValues(InputRequests)); got != 40 {
			t.Errorf("requests input gauge %v, want 40", got)
		}
		// Every request failing, for minutes: still 2 on its own.
		in.set(DegradeSignals{ErrorRate: 1, LatestErrorRate: 1, Requests: 400})
		checkLevel(t, "all failing for 2 min", after(120), 2)
		// A second input at 3: 3.
		in.set(DegradeSignals{ErrorRate: 1, LatestErrorRate: 1, Requests: 400, BacklogFraction: 0.85})
		checkLevel(t, "beside a critical backlog", after(1), 3)
		if logs.Count("input=backlog_fraction") != 1 {
			t.Errorf("level 3 logged as %q; want the backlog named", logs.String())
		}
		// The failures stop: the minute still reads 40 %, its latest
		// seconds none. The level falls through 2 to 0, each after the
		// hold, as it does when the minute empties.
		in.set(DegradeSignals{ErrorRate: 0.4, LatestErrorRate: 0, Requests: 400})
		checkLevel(t, "recovered for 29 s", after(29), 3)
		checkLevel(t, "recovered for the hold", after(2), 0)
	})
}

// At level 3 one normal request in ProbeEvery is admitted, so the last
// minute keeps learning; high always is, low never.
func TestDegraderProbes(t *testing.T) {
	t.Parallel()
	in := &fakeSignals{}
	m := newMetrics(t)
	d, err := NewDegrader(DegradeConfig{ProbeEvery: 5}, in, m, testutil.DiscardLogger())
	if err != nil {
		t.Fatal(err)
	}
	in.set(DegradeSignals{BacklogFraction: 0.9})
	if lvl := d.Step(time.Now()); lvl != 3 {
		t.Fatalf("level %d, want 3", lvl)
	}
	admitted := map[protocol.Priority]int{}
	for range 50 {
		for _, p := range protocol.Priorities {
			if d.Check(p) == nil {
				admitted[p]++
			}
		}
	}
	if admitted[protocol.PriorityNormal] != 10 || admitted[protocol.PriorityHigh] != 50 || admitted[protocol.PriorityLow] != 0 {
		t.Errorf("admitted of 50 each at level 3: %v; want 10 normal (one in 5), 50 high, no low", admitted)
	}
	if got := promtest.ToFloat64(m.QueueRejections.WithLabelValues(ReasonDegraded, "normal")); got != 40 {
		t.Errorf("degraded normal rejections %v, want the 40 not probed", got)
	}
}
