package upstream

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/llm/breaker"
	"github.com/spillway-dev/spillway/internal/metrics"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// switchable is an in-process provider that answers "ok", or fails with a
// retryable 500 while fail is set; it counts the calls that reached it.
type switchable struct {
	fail  atomic.Bool
	calls atomic.Int64
}

func (s *switchable) Name() string { return "switchable" }

func (s *switchable) Stream(_ context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	s.calls.Add(1)
	if s.fail.Load() {
		return llm.Result{}, &llm.Error{Retryable: true, Status: http.StatusInternalServerError, Err: errors.New("500")}
	}
	if err := emit(protocol.Chunk{Content: "ok"}); err != nil {
		return llm.Result{}, err
	}
	return llm.Result{FinishReason: "stop"}, nil
}

// Each upstream sits behind its own breaker.Breaker, as the app wires
// it: one failing replica opens only its own circuit and is routed
// around; the others' stay closed and carry every call. Only when every
// circuit is open do calls fail fast with a circuit-open error (the
// worker's path too, instead of waiting), and Circuits are open (the gate refuses);
// when the open time is over a trial call closes a recovered circuit.
func TestCircuitPerUpstream(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		provs := []*switchable{{}, {}, {}}
		specs := []Spec{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}
		m := metrics.New(prometheus.NewRegistry())
		log := slog.New(slog.DiscardHandler)
		var breakers []*breaker.Breaker
		b, err := New(specs, Config{Routing: RoutingWeighted}, Deps{
			NewProvider: func(s Spec) (llm.Provider, error) {
				br, err := breaker.New(breaker.Config{Name: s.Name, ConsecutiveFailures: 3,
					MinRequests: 1000, OpenTimeout: 30 * time.Second, HalfOpenMaxRequests: 1}, provs[len(breakers)], m, log)
				if err != nil {
					return nil, err
				}
				breakers = append(breakers, br)
				return br, nil
			},
			// Ejection must not hide the breakers: it takes many failures.
			Health: NewLocalHealth(3, HealthConfig{MaxFails: 1000}, nil),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		circuits, err := breaker.NewCircuits(breakers...)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()

		provs[1].fail.Store(true)
		for i := range 30 {
			if got, err := collect(ctx, b, chat("x")); err != nil || got != "ok" {
				t.Fatalf("call %d with b failing: %q, %v; want every call served by a or c", i, got, err)
			}
		}
		if n := provs[1].calls.Load(); n != 3 {
			t.Fatalf("b got %d calls; want 3, then its circuit open and routed around", n)
		}
		for i, want := range []float64{0, 2, 0} {
			if got := promtest.ToFloat64(m.CircuitState.WithLabelValues(specs[i].Name)); got != want {
				t.Errorf("spillway_circuit_state{provider=%q} = %v, want %v", specs[i].Name, got, want)
			}
		}
		if left := circuits.OpenFor(); left != 0 {
			t.Fatalf("circuits open for %v with one circuit of three open, want 0", left)
		}

		provs[0].fail.Store(true)
		provs[2].fail.Store(true)
		for range 6 {
			_, _ = collect(ctx, b, chat("x"))
		}
		before := provs[0].calls.Load() + provs[1].calls.Load() + provs[2].calls.Load()
		_, err = collect(ctx, b, chat("x"))
		var le *llm.Error
		if !llm.IsCircuitOpen(err) || !errors.As(err, &le) || !le.Retryable || le.RetryAfter <= 0 || le.RetryAfter > 30*time.Second {
			t.Fatalf("every circuit open: %v; want a retryable circuit-open error with a Retry-After", err)
		}
		// The worker's path fails fast too: it waits out the circuit with
		// its own Retry-After instead of holding a slot here.
		wctx, cancel := context.WithTimeout(llm.WithCapacityWait(ctx), time.Minute)
		start := time.Now()
		_, err = collect(wctx, b, chat("x"))
		cancel()
		if !llm.IsCircuitOpen(err) || time.Since(start) != 0 {
			t.Fatalf("worker path with every circuit open: %v after %s; want the circuit-open error at once", err, time.Since(start))
		}
		if after := provs[0].calls.Load() + provs[1].calls.Load() + provs[2].calls.Load(); after != before {
			t.Fatalf("%d calls reached upstreams behind open circuits", after-before)
		}
		if left := circuits.OpenFor(); left <= 0 || left > 30*time.Second {
			t.Fatalf("circuits open for %v with every circuit open; want up to 30s", left)
		}

		// c recovers; after the open time its trial call closes it.
		provs[2].fail.Store(false)
		time.Sleep(31 * time.Second)
		for i := range 10 {
			if got, err := collect(ctx, b, chat("x")); err != nil || got != "ok" {
				t.Fatalf("call %d after c recovered: %q, %v", i, got, err)
			}
		}
		if got := promtest.ToFloat64(m.CircuitState.WithLabelValues("c")); got != 0 {
			t.Fatalf("c's circuit %v after its trial succeeded, want closed", got)
		}
		if left := circuits.OpenFor(); left != 0 {
			t.Fatalf("circuits open for %v with c's circuit closed, want 0", left)
		}
	})
}
