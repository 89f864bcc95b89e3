package breaker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sony/gobreaker/v2"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// fakeProvider answers with whatever fn does and counts calls.
type fakeProvider struct {
	fn    func(ctx context.Context, emit func(protocol.Chunk) error) (llm.Result, error)
	calls atomic.Int64
}

func (f *fakeProvider) Name() string { return "fake" }

func (f *fakeProvider) Stream(ctx context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	f.calls.Add(1)
	return f.fn(ctx, emit)
}

var errUpstream = &llm.Error{Retryable: true, Status: http.StatusBadGateway, Err: errors.New("upstream 502")}

// scripted returns a provider that fails while fail is true and answers
// "hi" otherwise.
func scripted(fail *atomic.Bool) *fakeProvider {
	return &fakeProvider{fn: func(_ context.Context, emit func(protocol.Chunk) error) (llm.Result, error) {
		if fail.Load() {
			return llm.Result{}, errUpstream
		}
		if err := emit(protocol.Chunk{Content: "hi"}); err != nil {
			return llm.Result{}, fmt.Errorf("fake: emit: %w", err)
		}
		return llm.Result{FinishReason: "stop"}, nil
	}}
}

func newMetrics(tb testing.TB) *metrics.Metrics {
	tb.Helper()
	return metrics.New(prometheus.NewRegistry())
}

func newTestBreaker(tb testing.TB, cfg Config, p llm.Provider) (*Breaker, *metrics.Metrics, *testutil.LogBuffer) {
	tb.Helper()
	log, lb := testutil.NewLog(tb)
	m := newMetrics(tb)
	b, err := New(cfg, p, m, log)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return b, m, lb
}

func call(b *Breaker) error {
	_, err := b.Stream(context.Background(), protocol.ChatRequest{}, func(protocol.Chunk) error { return nil })
	return err
}

func TestBreakerLifecycle(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var fail atomic.Bool
		p := scripted(&fail)
		b, m, lb := newTestBreaker(t, Config{ConsecutiveFailures: 3, MinRequests: 100, OpenTimeout: 10 * time.Second, HalfOpenMaxRequests: 1}, p)
		gauge := m.CircuitState.WithLabelValues("fake")
		var seen []float64
		observe := func() {
			if v := promtest.ToFloat64(gauge); len(seen) == 0 || seen[len(seen)-1] != v {
				seen = append(seen, v)
			}
		}
		observe()

		fail.Store(true)
		for i := range 2 {
			if err := call(b); !errors.Is(err, errUpstream) {
				t.Fatalf("failure %d: err %v, want the provider's error unchanged", i+1, err)
			}
			observe()
		}
		if b.State() != gobreaker.StateClosed || b.OpenFor() != 0 {
			t.Fatalf("after 2 of 3 failures: state %v, OpenFor %v; want closed and accepting", b.State(), b.OpenFor())
		}
		_ = call(b)
		observe()
		if b.State() != gobreaker.StateOpen {
			t.Fatalf("after 3 consecutive failures: state %v, want open", b.State())
		}

		// Open: fail fast, without calling the provider.
		calls := p.calls.Load()
		err := call(b)
		if !errors.Is(err, llm.ErrCircuitOpen) || !llm.IsRetryable(err) {
			t.Fatalf("Stream while open: %v; want a retryable error wrapping llm.ErrCircuitOpen", err)
		}
		var le *llm.Error
		if !errors.As(err, &le) || le.RetryAfter != 10*time.Second {
			t.Fatalf("Stream while open: RetryAfter %v, want 10s", le)
		}
		if p.calls.Load() != calls {
			t.Fatal("the provider was called while the circuit was open")
		}
		checkOpen := func(want time.Duration) {
			t.Helper()
			if got := b.OpenFor(); got != want {
				t.Fatalf("OpenFor = %v, want %v", got, want)
			}
		}
		checkOpen(10 * time.Second)
		testutil.AdvanceFakeClock(4 * time.Second)
		checkOpen(6 * time.Second)
		testutil.AdvanceFakeClock(5*time.Second + 500*time.Millisecond)
		checkOpen(500 * time.Millisecond)
		observe()

		// Past OpenTimeout: half-open, trial calls allowed.
		testutil.AdvanceFakeClock(501 * time.Millisecond)
		if left := b.OpenFor(); left != 0 {
			t.Fatalf("OpenFor after OpenTimeout = %v, want 0 (half-open)", left)
		}
		if b.State() != gobreaker.StateHalfOpen {
			t.Fatalf("state after OpenTimeout = %v, want half-open", b.State())
		}
		observe()

		fail.Store(false)
		if err := call(b); err != nil {
			t.Fatalf("trial call: %v", err)
		}
		if b.State() != gobreaker.StateClosed || b.OpenFor() != 0 {
			t.Fatalf("after a successful trial: state %v, want closed", b.State())
		}
		observe()
		if want := []float64{0, 2, 1, 0}; fmt.Sprint(seen) != fmt.Sprint(want) {
			t.Fatalf("spillway_circuit_state went %v, want %v", seen, want)
		}
		if lb.Count("provider circuit opened") != 1 || lb.Count("provider circuit half-open") != 1 || lb.Count("provider circuit closed") != 1 {
			t.Fatalf("want one log line per transition:\n%s", lb)
		}
	})
}

func TestBreakerHalfOpenFailureReopens(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var fail atomic.Bool
		fail.Store(true)
		b, m, _ := newTestBreaker(t, Config{ConsecutiveFailures: 1, OpenTimeout: 5 * time.Second}, scripted(&fail))
		_ = call(b)
		testutil.AdvanceFakeClock(5*time.Second + time.Millisecond)
		if b.OpenFor() != 0 || b.State() != gobreaker.StateHalfOpen {
			t.Fatalf("not half-open after OpenTimeout: %v", b.State())
		}
		_ = call(b) // the trial fails
		if b.State() != gobreaker.StateOpen {
			t.Fatalf("state after a failed trial = %v, want open", b.State())
		}
		if left := b.OpenFor(); left != 5*time.Second {
			t.Fatalf("OpenFor after reopening = %v, want a fresh 5s", left)
		}
		if got := promtest.ToFloat64(m.CircuitState.WithLabelValues("fake")); got != 2 {
			t.Fatalf("gauge = %v, want 2", got)
		}
	})
}

// While half-open, calls beyond the trial budget are refused fast too.
func TestBreakerHalfOpenLimitsTrials(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var fail atomic.Bool
		fail.Store(true)
		p := &fakeProvider{fn: func(ctx context.Context, emit func(protocol.Chunk) error) (llm.Result, error) {
			if fail.Load() {
				return llm.Result{}, errUpstream
			}
			<-release
			return llm.Result{}, nil
		}}
		b, _, _ := newTestBreaker(t, Config{ConsecutiveFailures: 1, OpenTimeout: time.Second, HalfOpenMaxRequests: 1}, p)
		_ = call(b)
		testutil.AdvanceFakeClock(time.Second + time.Millisecond)
		fail.Store(false)
		trial := make(chan error, 1)
		go func() { trial <- call(b) }()
		synctest.Wait() // the trial is inside the provider
		if err := call(b); !errors.Is(err, llm.ErrCircuitOpen) {
			t.Fatalf("second call while the trial runs: %v, want llm.ErrCircuitOpen", err)
		}
		close(release)
		if err := <-trial; err != nil {
			t.Fatalf("trial: %v", err)
		}
		if b.State() != gobreaker.StateClosed {
			t.Fatalf("state after the trial = %v, want closed", b.State())
		}
	})
}

func TestBreakerCountsOnlyProviderFailures(t *testing.T) {
	t.Parallel()
	errClientGone := errors.New("client gone")
	tests := []struct {
		name     string
		run      func(b *Breaker) error
		wantOpen bool
		wantErr  error
	}{
		{"provider failure", func(b *Breaker) error { return call(b) }, true, errUpstream},
		{"caller cancelled", func(b *Breaker) error {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := b.Stream(ctx, protocol.ChatRequest{}, func(protocol.Chunk) error { return nil })
			return err
		}, false, context.Canceled},
		{"caller deadline passed", func(b *Breaker) error {
			ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
			defer cancel()
			_, err := b.Stream(ctx, protocol.ChatRequest{}, func(protocol.Chunk) error { return nil })
			return err
		}, false, context.DeadlineExceeded},
		{"client gone during emit", func(b *Breaker) error {
			_, err := b.Stream(context.Background(), protocol.ChatRequest{}, func(protocol.Chunk) error { return errClientGone })
			return err
		}, false, errClientGone},
		{"bad request", func(b *Breaker) error { return call(b) }, false, nil},
		{"unauthorized counts", func(b *Breaker) error { return call(b) }, true, nil},
		{"throttled upstream (429)", func(b *Breaker) error { return call(b) }, false, nil},
		{"overloaded upstream (503) counts", func(b *Breaker) error { return call(b) }, true, nil},
		{"unknown model (404)", func(b *Breaker) error { return call(b) }, false, nil},
		{"idle timeout after the first chunk", func(b *Breaker) error { return call(b) }, false, llm.ErrIdleTimeout},
		{"total timeout after the first chunk", func(b *Breaker) error { return call(b) }, false, llm.ErrTotalTimeout},
		{"first-token timeout counts", func(b *Breaker) error { return call(b) }, true, llm.ErrFirstTokenTimeout},
	}
	statusOf := map[string]*llm.Error{
		"bad request":                         {Status: http.StatusBadRequest, Err: errors.New("400")},
		"unauthorized counts":                 {Status: http.StatusUnauthorized, Err: errors.New("401")},
		"throttled upstream (429)":            {Retryable: true, Status: http.StatusTooManyRequests, RetryAfter: time.Second, Err: errors.New("429")},
		"overloaded upstream (503) counts":    {Retryable: true, Status: http.StatusServiceUnavailable, Err: errors.New("503")},
		"unknown model (404)":                 {Status: http.StatusNotFound, Err: errors.New("404")},
		"idle timeout after the first chunk":  {Retryable: true, Status: http.StatusOK, Err: llm.ErrIdleTimeout},
		"total timeout after the first chunk": {Retryable: true, Status: http.StatusOK, Err: llm.ErrTotalTimeout},
		"first-token timeout counts":          {Retryable: true, Err: llm.ErrFirstTokenTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := &fakeProvider{fn: func(ctx context.Context, emit func(protocol.Chunk) error) (llm.Result, error) {
				if le, ok := statusOf[tt.name]; ok {
					return llm.Result{}, le
				}
				if err := ctx.Err(); err != nil {
					return llm.Result{}, fmt.Errorf("fake: %w", err)
				}
				if err := emit(protocol.Chunk{Content: "x"}); err != nil {
					return llm.Result{}, fmt.Errorf("fake: emit: %w", err)
				}
				return llm.Result{}, errUpstream
			}}
			b, _, _ := newTestBreaker(t, Config{ConsecutiveFailures: 3, MinRequests: 1000}, p)
			for range 10 {
				err := tt.run(b)
				if errors.Is(err, llm.ErrCircuitOpen) {
					break
				}
				if err == nil {
					t.Fatal("Stream returned nil, want the provider's error")
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("Stream error %v, want it to wrap %v", err, tt.wantErr)
				}
			}
			if open := b.State() == gobreaker.StateOpen; open != tt.wantOpen {
				t.Fatalf("after 10 calls: state %v, want open %v", b.State(), tt.wantOpen)
			}
		})
	}
}

func TestBreakerFailureRatio(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		pattern  string // S success, F failure
		wantOpen bool
	}{
		{"half failing, min requests reached", "SFSFSFSFSF", true},
		{"half failing, one short of min requests", "SFSFSFSFS", false},
		{"one in ten failing", "SSSSSSSSSF", false},
		{"four in ten failing", "SSFSSFSSFF", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var fail atomic.Bool
			b, _, _ := newTestBreaker(t, Config{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 10}, scripted(&fail))
			for _, c := range tt.pattern {
				fail.Store(c == 'F')
				_ = call(b)
			}
			if open := b.State() == gobreaker.StateOpen; open != tt.wantOpen {
				t.Fatalf("after %s: state %v, want open %v", tt.pattern, b.State(), tt.wantOpen)
			}
		})
	}
}

// Failures spread over more than Window do not add up to a ratio trip.
func TestBreakerWindowForgets(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var fail atomic.Bool
		b, _, _ := newTestBreaker(t, Config{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 4, Window: time.Minute}, scripted(&fail))
		for _, c := range "FFS" {
			fail.Store(c == 'F')
			_ = call(b)
		}
		testutil.AdvanceFakeClock(2 * time.Minute)
		fail.Store(true)
		_ = call(b) // 3 of 4 would trip if the old calls still counted
		if b.State() != gobreaker.StateClosed {
			t.Fatalf("state %v: calls older than Window still counted", b.State())
		}
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	want := Config{ConsecutiveFailures: 5, FailureRatio: 0.5, MinRequests: 20, Window: time.Minute,
		OpenTimeout: 30 * time.Second, HalfOpenMaxRequests: 3}
	if got := (Config{}).withDefaults(); got != want {
		t.Fatalf("zero config with defaults = %+v, want %+v", got, want)
	}
	for _, c := range []Config{{FailureRatio: 1.5}, {FailureRatio: -0.1}, {OpenTimeout: -time.Second}, {Window: -time.Second}} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", c)
		}
	}
	if _, err := New(Config{}, nil, newMetrics(t), testutil.DiscardLogger()); err == nil {
		t.Error("NewBreaker without a provider succeeded")
	}
}

// Several upstreams, one breaker each (named after its upstream):
// Circuits are open only while every circuit is, for as long as the one
// that half-opens first has left.
func TestCircuitsOpenOnlyWhenAllOpen(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		log, _ := testutil.NewLog(t)
		m := newMetrics(t)
		var fail atomic.Bool
		fail.Store(true)
		var bs []*Breaker
		for _, name := range []string{"replica-1:8000", "replica-2:8000"} {
			b, err := New(Config{Name: name, ConsecutiveFailures: 1, OpenTimeout: 10 * time.Second}, scripted(&fail), m, log)
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		if _, err := NewCircuits(); err == nil {
			t.Fatal("NewCircuits without breakers: want an error")
		}
		c, err := NewCircuits(bs...)
		if err != nil {
			t.Fatal(err)
		}
		_ = call(bs[0])
		if bs[0].OpenFor() != 10*time.Second || bs[1].OpenFor() != 0 {
			t.Fatalf("OpenFor = %v and %v, want 10s and 0", bs[0].OpenFor(), bs[1].OpenFor())
		}
		if left := c.OpenFor(); left != 0 {
			t.Fatalf("one circuit of two open: Circuits open for %v, want 0", left)
		}
		if got := promtest.ToFloat64(m.CircuitState.WithLabelValues("replica-1:8000")); got != 2 {
			t.Fatalf("replica-1's gauge %v, want 2 (open)", got)
		}
		if got := promtest.ToFloat64(m.CircuitState.WithLabelValues("replica-2:8000")); got != 0 {
			t.Fatalf("replica-2's gauge %v, want 0 (closed)", got)
		}
		testutil.AdvanceFakeClock(4 * time.Second)
		_ = call(bs[1])
		err = call(bs[1])
		if !llm.IsCircuitOpen(err) || !strings.Contains(err.Error(), "replica-2:8000") {
			t.Fatalf("call behind replica-2's open circuit: %v, want llm.ErrCircuitOpen naming it", err)
		}
		if left := c.OpenFor(); left != 6*time.Second {
			t.Fatalf("every circuit open: Circuits open for %v, want 6s (replica-1 half-opens first)", left)
		}
		testutil.AdvanceFakeClock(6*time.Second + time.Millisecond)
		if left := c.OpenFor(); left != 0 {
			t.Fatalf("replica-1 half-open: Circuits open for %v, want 0", left)
		}
	})
}
