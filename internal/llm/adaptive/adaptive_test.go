package adaptive

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

var epoch = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// step is one report at an offset from epoch and the limit after it.
type step struct {
	at    time.Duration
	calls int64
	thr   bool
	want  int
}

// Steps is the rule as a table: the Lua version in redispool is held to
// the same behaviour by running State.Apply beside it.
func TestStateApply(t *testing.T) {
	t.Parallel()
	p := Params{Floor: 2, Ceiling: 10, Interval: time.Second}
	steps := []step{
		{0, 0, false, 10},                       // starts at the ceiling
		{1100 * time.Millisecond, 5, false, 10}, // an interval closes: at the ceiling already
		{1200 * time.Millisecond, 0, true, 5},   // a throttle halves at once
		{1300 * time.Millisecond, 0, true, 5},   // not twice in one interval
		{2150 * time.Millisecond, 3, false, 5},  // closing a throttled interval adds nothing
		{2200 * time.Millisecond, 0, true, 2},   // a second since the last decrease: halves again (5/2 = 2)
		{3250 * time.Millisecond, 4, false, 2},  // throttled interval closes
		{4300 * time.Millisecond, 4, false, 3},  // a healthy interval with calls: +1
		{5400 * time.Millisecond, 0, false, 3},  // an interval without calls: nothing
		{6500 * time.Millisecond, 1, false, 4},  // +1
		{6600 * time.Millisecond, 0, true, 2},   // halves to the floor
		{6700 * time.Millisecond, 0, false, 2},  // nothing new
		{20 * time.Second, 9, false, 2},         // throttled interval, closed late: no +1
		{21 * time.Second, 1, true, 2},          // +1 for the healthy interval, then halved to the floor
		{22 * time.Second, 1, false, 2},         // throttled interval
		{23 * time.Second, 1, false, 3},         // +1 per interval, not per second passed
		{30 * time.Second, 1, false, 4},         // a long interval is one interval
		{31*time.Second + time.Millisecond, 1, false, 5},
	}
	var s State
	for i, st := range steps {
		s.Apply(Report{Calls: st.calls, Throttle: st.thr}, epoch.Add(st.at), p)
		if s.Limit != st.want {
			t.Fatalf("step %d (%+v): limit %d, want %d (state %+v)", i, st, s.Limit, st.want, s)
		}
	}
	// A ceiling lowered under a limit clamps it.
	s.Apply(Report{}, epoch.Add(32*time.Second), Params{Floor: 1, Ceiling: 3, Interval: time.Second})
	if s.Limit != 3 {
		t.Errorf("limit %d after the ceiling fell to 3", s.Limit)
	}
}

// A limit climbs back to the ceiling one interval at a time and says when
// it grew.
func TestStateApplyGrows(t *testing.T) {
	t.Parallel()
	p := Params{Floor: 1, Ceiling: 4, Interval: 100 * time.Millisecond}
	s := State{}
	s.Apply(Report{Throttle: true}, epoch, p)
	if s.Limit != 2 {
		t.Fatalf("after a throttle at the start: %d, want 2", s.Limit)
	}
	var grew int
	for i := 1; i <= 5; i++ {
		if s.Apply(Report{Calls: 1}, epoch.Add(time.Duration(i)*100*time.Millisecond), p) {
			grew++
		}
	}
	// Interval 1 was throttled; 2 and 3 add one each; then at the ceiling.
	if s.Limit != 4 || grew != 2 {
		t.Errorf("limit %d after grew %d times, want 4 after 2", s.Limit, grew)
	}
}

func TestParamsAndConfigValidate(t *testing.T) {
	t.Parallel()
	for _, p := range []Params{{Floor: 0, Ceiling: 1, Interval: time.Second}, {Floor: 3, Ceiling: 2, Interval: time.Second}, {Floor: 1, Ceiling: 1}} {
		if p.Validate() == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	ok := Params{Floor: 1, Ceiling: 1, Interval: time.Second}
	for _, c := range []Config{{Params: ok}, {Name: "x", Params: ok, FirstTokenTarget: -1}} {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if _, err := New(Config{Name: "x", Params: ok}, nil, nil, nil); err == nil {
		t.Error("a controller without a store was built")
	}
	if _, err := NewLocalStore().Report(t.Context(), "x", Report{}, Params{}); err == nil {
		t.Error("a report with zero params was accepted")
	}
}

// The ranges are *bounds.Errors naming the field; the edges pass.
func TestParamsBounds(t *testing.T) {
	t.Parallel()
	if err := (Params{Floor: 1, Ceiling: 1, Interval: MinInterval}).Validate(); err != nil {
		t.Errorf("edge params: %v", err)
	}
	err := Params{Floor: 0, Ceiling: 1, Interval: MinInterval - time.Millisecond}.Validate()
	if !testutil.HasBound(err, "Floor") || !testutil.HasBound(err, "Interval") {
		t.Errorf("Validate() = %v, want bounds errors for Floor and Interval", err)
	}
	err = Config{Name: "x", Params: Params{Floor: 1, Ceiling: 1, Interval: time.Second}, FirstTokenTarget: -time.Millisecond}.Validate()
	if !testutil.HasBound(err, "FirstTokenTarget") {
		t.Errorf("Validate() = %v, want a bounds error for FirstTokenTarget", err)
	}
	// Ceiling below the floor is a rule between two fields, not a range.
	if err := (Params{Floor: 3, Ceiling: 2, Interval: time.Second}).Validate(); err == nil || len(bounds.Errors(err)) != 0 {
		t.Errorf("Validate() = %v, want one plain error", err)
	}
}

// LocalStore keeps one state per name.
func TestLocalStoreNames(t *testing.T) {
	t.Parallel()
	l := NewLocalStore()
	p := Params{Floor: 1, Ceiling: 8, Interval: time.Hour}
	if n, _ := l.Report(t.Context(), "a", Report{Throttle: true}, p); n != 4 {
		t.Fatalf("a after a throttle: %d, want 4", n)
	}
	if n, _ := l.Report(t.Context(), "b", Report{}, p); n != 8 {
		t.Fatalf("b untouched by a's throttle: %d, want 8", n)
	}
}

// recordingStore is a Store that records reports and answers from a
// LocalStore.
type recordingStore struct {
	inner *LocalStore
	mu    sync.Mutex
	got   []Report
	fail  bool
}

func (r *recordingStore) Report(ctx context.Context, name string, rep Report, p Params) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return 0, errors.New("store down")
	}
	r.got = append(r.got, rep)
	return r.inner.Report(ctx, name, rep, p)
}

func (r *recordingStore) reports() []Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Report(nil), r.got...)
}

var (
	throttled = llm.Call{Err: &llm.Error{Retryable: true, Status: http.StatusTooManyRequests}}
	fast      = llm.Call{Chunks: true, FirstChunk: 10 * time.Millisecond}
	slow      = llm.Call{Chunks: true, FirstChunk: 3 * time.Second}
)

// The controller reports a 429 at once, the rest each interval, and
// hands the limit to onLimit; on the fake clock of testing/synctest.
func TestControllerReports(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := &recordingStore{inner: NewLocalStore()}
		store.inner.now = time.Now // the bubble's clock
		var mu sync.Mutex
		var limits []int
		c, err := New(Config{Name: "global", Params: Params{Floor: 1, Ceiling: 16, Interval: time.Second}},
			store, testutil.DiscardLogger(), func(n int) { mu.Lock(); limits = append(limits, n); mu.Unlock() })
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.Run(ctx)

		for range 3 {
			c.Observe(fast)
		}
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		if got := store.reports(); len(got) != 1 || got[0] != (Report{Calls: 3}) {
			t.Fatalf("after an interval: reports %+v, want one of 3 calls", got)
		}
		c.Observe(throttled)
		synctest.Wait() // no time passes: the throttle goes out at once
		if got := store.reports(); len(got) != 2 || got[1] != (Report{Throttle: true}) {
			t.Fatalf("after a 429: reports %+v, want a throttle at once", got)
		}
		if c.Limit() != 8 {
			t.Errorf("limit after a 429: %d, want 8", c.Limit())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		// The 429 call itself is counted with the interval, and the
		// interval is not throttled again.
		if got := store.reports(); len(got) != 3 || got[2] != (Report{Calls: 1}) {
			t.Fatalf("the interval after: reports %+v, want 1 call, no throttle", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(limits) != 3 || limits[0] != 16 || limits[1] != 8 {
			t.Errorf("onLimit got %v, want 16, 8, …", limits)
		}
	})
}

// With a first-token target, an interval where more than 1 % of first
// chunks were slower than it is a throttle.
func TestControllerFirstTokenTarget(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := &recordingStore{inner: NewLocalStore()}
		store.inner.now = time.Now
		c, err := New(Config{Name: "global", Params: Params{Floor: 1, Ceiling: 16, Interval: time.Second},
			FirstTokenTarget: time.Second}, store, testutil.DiscardLogger(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.Run(ctx)
		// 1 slow of 100: the p99 is at the target's side, no throttle.
		for range 99 {
			c.Observe(fast)
		}
		c.Observe(slow)
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		// 2 slow of 100: over it.
		for range 98 {
			c.Observe(fast)
		}
		c.Observe(slow)
		c.Observe(slow)
		time.Sleep(time.Second)
		synctest.Wait()
		got := store.reports()
		if len(got) != 2 || got[0].Throttle || !got[1].Throttle || got[1].Calls != 100 {
			t.Fatalf("reports %+v, want a healthy interval then a throttled one", got)
		}
		if c.Limit() != 8 {
			t.Errorf("limit %d, want 8", c.Limit())
		}
	})
}

// A report the store refuses is kept for the next one; the limit stays.
func TestControllerKeepsReportsWhileStoreFails(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		store := &recordingStore{inner: NewLocalStore(), fail: true}
		store.inner.now = time.Now
		c, err := New(Config{Name: "global", Params: Params{Floor: 1, Ceiling: 4, Interval: time.Second}}, store, testutil.DiscardLogger(), nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.Run(ctx)
		c.Observe(fast)
		c.Observe(throttled)
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		if c.Limit() != 4 {
			t.Fatalf("limit %d while the store fails, want the ceiling", c.Limit())
		}
		store.mu.Lock()
		store.fail = false
		store.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := store.reports(); len(got) != 1 || got[0] != (Report{Calls: 2, Throttle: true}) {
			t.Fatalf("reports %+v, want the kept calls and throttle in one", got)
		}
		if c.Limit() != 2 {
			t.Errorf("limit %d, want 2", c.Limit())
		}
	})
}
