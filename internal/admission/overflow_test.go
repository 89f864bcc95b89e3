package admission

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func newTestOverflow(tb testing.TB, cfg OverflowConfig) (*Overflow, *fakeDepth, *testutil.LogBuffer, func() (depth, threshold, rejected float64)) {
	tb.Helper()
	fd := &fakeDepth{}
	log, lb := testutil.NewLog(tb)
	m := newMetrics(tb)
	o, err := NewOverflow(cfg, DepthFunc(fd.read), m, log)
	if err != nil {
		tb.Fatalf("NewOverflow: %v", err)
	}
	read := func() (float64, float64, float64) {
		return promtest.ToFloat64(m.QueueDepth), promtest.ToFloat64(m.QueueThreshold),
			promtest.ToFloat64(m.QueueRejections.WithLabelValues("overflow", "high"))
	}
	return o, fd, lb, read
}

func TestOverflowHysteresis(t *testing.T) {
	t.Parallel()
	cfg := OverflowConfig{Threshold: 100, Hysteresis: 10, RefreshEvery: time.Second, RetryAfterMax: 30 * time.Second}
	o, fd, _, read := newTestOverflow(t, cfg)
	if p := o.Check(protocol.PriorityHigh); p != nil {
		t.Fatalf("Check before any refresh = %v, want accept", p)
	}
	steps := []struct {
		depth  int64
		refuse bool
		why    string
	}{
		{50, false, "well below threshold"},
		{99, false, "just below threshold"},
		{100, true, "at threshold"},
		{150, true, "above threshold"},
		{95, true, "between threshold-hysteresis and threshold while draining"},
		{91, true, "still above resume level"},
		{90, true, "at resume level: not yet below it"},
		{89, false, "below threshold-hysteresis"},
		{95, false, "rising again but below threshold"},
		{99, false, "just below threshold again"},
		{100, true, "at threshold again"},
	}
	t0 := time.Now()
	refusals := 0
	for i, s := range steps {
		fd.set(s.depth, nil)
		o.refresh(context.Background(), t0.Add(time.Duration(i)*time.Second))
		p := o.Check(protocol.PriorityHigh)
		if (p != nil) != s.refuse {
			t.Fatalf("step %d (%s): depth %d: Check = %v, want refuse %v", i, s.why, s.depth, p, s.refuse)
		}
		if p != nil {
			refusals++
			if p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemQueueOverflow {
				t.Errorf("step %d: problem %d %q, want 503 %q", i, p.Status, p.Slug(), protocol.ProblemQueueOverflow)
			}
			if p.RetryAfterSeconds < 1 || p.RetryAfterSeconds > 30 {
				t.Errorf("step %d: retry_after %d, want in [1, 30]", i, p.RetryAfterSeconds)
			}
		}
		if got := o.Depth(); got != s.depth {
			t.Errorf("step %d: Depth() = %d, want %d", i, got, s.depth)
		}
		depth, threshold, rejected := read()
		if depth != float64(s.depth) || threshold != 100 || rejected != float64(refusals) {
			t.Errorf("step %d: metrics depth %v threshold %v rejected %v, want %d 100 %d", i, depth, threshold, rejected, s.depth, refusals)
		}
	}
}

// The problem Check returns is the caller's to change (the api sets
// Instance): it must not alter what later callers get.
func TestOverflowCheckReturnsFreshProblem(t *testing.T) {
	t.Parallel()
	o, fd, _, _ := newTestOverflow(t, OverflowConfig{Threshold: 10, RefreshEvery: time.Second, RetryAfterMax: 5 * time.Second})
	fd.set(10, nil)
	o.refresh(context.Background(), time.Now())
	p := o.Check(protocol.PriorityHigh)
	p.Instance = "urn:x"
	if q := o.Check(protocol.PriorityHigh); q == p || q.Instance != "" {
		t.Fatalf("second Check shares state with the first: %+v", q)
	}
}

func TestOverflowCheckNeverReadsDepth(t *testing.T) {
	t.Parallel()
	for _, depth := range []int64{0, 20000} { // accepting and refusing
		o, fd, _, _ := newTestOverflow(t, OverflowConfig{Threshold: 10000, Hysteresis: 500, RefreshEvery: time.Second, RetryAfterMax: time.Minute})
		fd.set(depth, nil)
		o.refresh(context.Background(), time.Now())
		before := fd.calls.Load()
		if before != 1 {
			t.Fatalf("refresh made %d depth calls, want 1", before)
		}
		for range 10000 {
			_ = o.Check(protocol.PriorityHigh)
			_ = o.Depth()
		}
		if got := fd.calls.Load() - before; got != 0 {
			t.Fatalf("depth %d: 10000 Check calls made %d depth calls, want 0", depth, got)
		}
	}
}

func TestOverflowRunCadence(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		every := 250 * time.Millisecond
		o, fd, _, _ := newTestOverflow(t, OverflowConfig{Threshold: 100, Hysteresis: 0, RefreshEvery: every, RetryAfterMax: time.Minute})
		fd.set(150, nil)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); o.Run(ctx) }()

		synctest.Wait()
		if got := fd.calls.Load(); got != 1 {
			t.Fatalf("Run made %d depth calls at start, want 1 (immediate refresh)", got)
		}
		if o.Check(protocol.PriorityHigh) == nil {
			t.Fatal("Check accepts after Run's first refresh saw depth 150 over threshold 100")
		}
		testutil.AdvanceFakeClock(every / 2) // between ticks
		synctest.Wait()
		if got := fd.calls.Load(); got != 1 {
			t.Fatalf("%d depth calls before the first tick, want 1", got)
		}
		testutil.AdvanceFakeClock(5 * every) // five ticks
		synctest.Wait()
		if got := fd.calls.Load(); got != 6 {
			t.Fatalf("%d depth calls after 5.5 refresh periods, want 6", got)
		}
		fd.set(10, nil)
		testutil.AdvanceFakeClock(every)
		synctest.Wait()
		if p := o.Check(protocol.PriorityHigh); p != nil {
			t.Fatalf("Check still refuses one refresh after the depth fell to 10: %v", p)
		}
		cancel()
		<-done
		n := fd.calls.Load()
		testutil.AdvanceFakeClock(10 * every)
		synctest.Wait()
		if got := fd.calls.Load(); got != n {
			t.Fatalf("depth read %d times after Run returned", got-n)
		}
	})
}

func TestOverflowDepthReadFailure(t *testing.T) {
	t.Parallel()
	o, fd, lb, _ := newTestOverflow(t, OverflowConfig{Threshold: 100, Hysteresis: 10, RefreshEvery: time.Second, RetryAfterMax: time.Minute})
	ctx := context.Background()
	t0 := time.Now()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	boom := errors.New("redis down")

	fd.set(120, nil)
	o.refresh(ctx, at(0))
	for i := 1; i <= 3; i++ {
		fd.set(0, boom)
		o.refresh(ctx, at(i))
		if o.Depth() != 120 || o.Check(protocol.PriorityHigh) == nil {
			t.Fatalf("after failed read %d: Depth %d, Check %v; want last value 120 kept and refusing", i, o.Depth(), o.Check(protocol.PriorityHigh))
		}
	}
	if n := lb.Count("queue depth read failed"); n != 1 {
		t.Fatalf("%d failure lines for one streak of 3 failed reads, want 1:\n%s", n, lb)
	}
	fd.set(50, nil)
	o.refresh(ctx, at(4))
	if o.Depth() != 50 || o.Check(protocol.PriorityHigh) != nil {
		t.Fatalf("after recovery: Depth %d, Check %v; want 50 and accepting", o.Depth(), o.Check(protocol.PriorityHigh))
	}
	if n := lb.Count("queue depth read works again"); n != 1 {
		t.Fatalf("%d recovery lines, want 1:\n%s", n, lb)
	}
	fd.set(0, boom)
	o.refresh(ctx, at(5))
	o.refresh(ctx, at(6))
	if n := lb.Count("queue depth read failed"); n != 2 {
		t.Fatalf("%d failure lines after a second streak, want 2:\n%s", n, lb)
	}
}

func TestOverflowRetryAfter(t *testing.T) {
	t.Parallel()
	type sample struct {
		at    time.Duration
		depth int64
		fail  bool
	}
	// Threshold 10000, hysteresis 500: resume below 9500; max 60s.
	tests := []struct {
		name    string
		samples []sample
		want    int
	}{
		{"first sample, no rate yet", []sample{{0, 12000, false}}, 60},
		{"draining 100/s", []sample{{0, 12000, false}, {time.Second, 11900, false}, {2 * time.Second, 11800, false}}, 24}, // (11800-9500+1)/100 = 23.01
		{"draining 100/s over 2s refreshes", []sample{{0, 12000, false}, {2 * time.Second, 11800, false}}, 24},
		{"failed read stretches the interval", []sample{{0, 12000, false}, {time.Second, 0, true}, {2 * time.Second, 11800, false}}, 24},
		{"ewma of 100/s then 400/s", []sample{{0, 12000, false}, {time.Second, 11900, false}, {2 * time.Second, 11500, false}}, 12}, // rate 175: 2001/175 = 11.4
		{"flat backlog", []sample{{0, 10500, false}, {time.Second, 10500, false}}, 60},
		{"growing backlog", []sample{{0, 10000, false}, {time.Second, 10100, false}, {2 * time.Second, 10200, false}}, 60},
		{"slow drain clamps to max", []sample{{0, 20000, false}, {time.Second, 19990, false}}, 60},
		{"fast drain clamps to 1s", []sample{{0, 10000, false}, {time.Second, 9600, false}}, 1}, // 101/400
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, fd, _, _ := newTestOverflow(t, OverflowConfig{Threshold: 10000, Hysteresis: 500, RefreshEvery: time.Second, RetryAfterMax: time.Minute})
			t0 := time.Now()
			for _, s := range tt.samples {
				if s.fail {
					fd.set(0, errors.New("down"))
				} else {
					fd.set(s.depth, nil)
				}
				o.refresh(context.Background(), t0.Add(s.at))
			}
			p := o.Check(protocol.PriorityHigh)
			if p == nil {
				t.Fatal("Check accepts, want a refusal")
			}
			if p.RetryAfterSeconds != tt.want {
				t.Fatalf("retry_after = %d, want %d", p.RetryAfterSeconds, tt.want)
			}
		})
	}
}

func TestOverflowConfigValidate(t *testing.T) {
	t.Parallel()
	ok := OverflowConfig{Threshold: 10000, Hysteresis: 500, RefreshEvery: time.Second, RetryAfterMax: time.Minute}
	tests := []struct {
		name   string
		mutate func(*OverflowConfig)
		valid  bool
	}{
		{"defaults", func(*OverflowConfig) {}, true},
		{"no hysteresis", func(c *OverflowConfig) { c.Hysteresis = 0 }, true},
		{"negative threshold", func(c *OverflowConfig) { c.Threshold = -1 }, false},
		{"hysteresis at threshold", func(c *OverflowConfig) { c.Hysteresis = c.Threshold }, false},
		{"negative hysteresis", func(c *OverflowConfig) { c.Hysteresis = -1 }, false},
		{"negative refresh", func(c *OverflowConfig) { c.RefreshEvery = -time.Second }, false},
		{"retry max below 1s", func(c *OverflowConfig) { c.RetryAfterMax = 500 * time.Millisecond }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := ok
			tt.mutate(&c)
			if err := c.withDefaults().Validate(); (err == nil) != tt.valid {
				t.Fatalf("Validate() = %v, want valid %v", err, tt.valid)
			}
		})
	}
}

// As the backlog grows low is refused first, then normal, then high; as it
// drains each is accepted again below its own resume point (its level less
// the hysteresis scaled to it), high first.
func TestOverflowShedsByPriority(t *testing.T) {
	t.Parallel()
	cfg := OverflowConfig{Threshold: 100, Hysteresis: 10, RefreshEvery: time.Second, RetryAfterMax: 30 * time.Second}
	fd := &fakeDepth{}
	log, _ := testutil.NewLog(t)
	m := newMetrics(t)
	o, err := NewOverflow(cfg, DepthFunc(fd.read), m, log)
	if err != nil {
		t.Fatalf("NewOverflow: %v", err)
	}
	// Levels: low 50 (resume below 45), normal 80 (72), high 100 (90).
	steps := []struct {
		depth             int64
		low, normal, high bool // refused
	}{
		{0, false, false, false},
		{49, false, false, false},
		{50, true, false, false},
		{79, true, false, false},
		{80, true, true, false},
		{99, true, true, false},
		{100, true, true, true},
		{90, true, true, true},
		{89, true, true, false},
		{72, true, true, false},
		{71, true, false, false},
		{45, true, false, false},
		{44, false, false, false},
		{60, true, false, false},
	}
	t0 := time.Now()
	want := map[protocol.Priority]float64{}
	for i, s := range steps {
		fd.set(s.depth, nil)
		o.refresh(context.Background(), t0.Add(time.Duration(i)*time.Second))
		for prio, refuse := range map[protocol.Priority]bool{protocol.PriorityLow: s.low, protocol.PriorityNormal: s.normal, protocol.PriorityHigh: s.high} {
			p := o.Check(prio)
			if (p != nil) != refuse {
				t.Fatalf("step %d: depth %d: Check(%s) = %v, want refused %v", i, s.depth, prio, p, refuse)
			}
			if p != nil {
				want[prio]++
				if p.Status != http.StatusServiceUnavailable || p.Slug() != protocol.ProblemQueueOverflow || p.RetryAfterSeconds < 1 {
					t.Errorf("step %d: Check(%s) = %d %q retry %d, want 503 queue-overflow with Retry-After", i, prio, p.Status, p.Slug(), p.RetryAfterSeconds)
				}
			}
		}
	}
	for _, prio := range protocol.Priorities {
		if got := promtest.ToFloat64(m.QueueRejections.WithLabelValues("overflow", string(prio))); got != want[prio] {
			t.Errorf("rejections{overflow,%s} = %v, want %v", prio, got, want[prio])
		}
	}
}

func TestOverflowConfigShedFractions(t *testing.T) {
	t.Parallel()
	for _, c := range []OverflowConfig{
		{ShedLowFraction: 0.9, ShedNormalFraction: 0.8},
		{ShedLowFraction: -0.1},
		{ShedNormalFraction: 1.1},
	} {
		if err := c.withDefaults().Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	if err := (OverflowConfig{ShedLowFraction: 1, ShedNormalFraction: 1}).withDefaults().Validate(); err != nil {
		t.Errorf("fractions of 1 (shed only at the threshold): %v", err)
	}
}
