package llm_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// scripted fails its calls with errs in order, then succeeds.
type scripted struct {
	errs []error
	n    int
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Stream(context.Context, protocol.ChatRequest, func(protocol.Chunk) error) (llm.Result, error) {
	s.n++
	if s.n <= len(s.errs) {
		return llm.Result{}, s.errs[s.n-1]
	}
	return llm.Result{FinishReason: "stop"}, nil
}

func TestCountResponsesCountsOncePerCallWithAResponse(t *testing.T) {
	t.Parallel()
	inner := &scripted{errs: []error{
		&llm.Error{Retryable: true, Status: http.StatusTooManyRequests},
		&llm.Error{Retryable: true, Err: errors.New("connection refused")}, // no response
		&llm.Error{Status: http.StatusNotFound},
		&llm.Error{Retryable: true, Status: http.StatusOK, Err: llm.ErrIdleTimeout}, // inside a 200 stream
		context.Canceled,
	}}
	var codes []string
	p := llm.CountResponses(inner, func(code string) { codes = append(codes, code) })
	if p.Name() != "scripted" {
		t.Errorf("Name %q, want the wrapped provider's", p.Name())
	}
	for range 6 {
		_, _ = p.Stream(context.Background(), protocol.ChatRequest{}, func(protocol.Chunk) error { return nil })
	}
	if want := []string{"429", "404", "200", "200"}; !slices.Equal(codes, want) {
		t.Errorf("counted codes %q, want %q", codes, want)
	}
}

// chunky sends two chunks after a pause, then returns err.
type chunky struct {
	pause time.Duration
	err   error
}

func (c chunky) Name() string { return "chunky" }

func (c chunky) Stream(_ context.Context, _ protocol.ChatRequest, emit func(protocol.Chunk) error) (llm.Result, error) {
	time.Sleep(c.pause)
	for _, s := range []string{"a", "b"} {
		if err := emit(protocol.Chunk{Content: s}); err != nil {
			return llm.Result{}, err
		}
	}
	return llm.Result{}, c.err
}

func TestObserveReportsEachCall(t *testing.T) {
	t.Parallel()
	var calls []llm.Call
	observe := func(c llm.Call) { calls = append(calls, c) }
	p := llm.Observe(chunky{pause: 20 * time.Millisecond}, observe)
	if p.Name() != "chunky" {
		t.Errorf("Name %q, want the wrapped provider's", p.Name())
	}
	var got []string
	if _, err := p.Stream(context.Background(), protocol.ChatRequest{}, func(chunk protocol.Chunk) error {
		s := chunk.Content
		got = append(got, s)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || !calls[0].Chunks || calls[0].FirstChunk < 20*time.Millisecond || calls[0].Err != nil || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("calls %+v, chunks %q: want one call with a first chunk after 20ms and both chunks passed on", calls, got)
	}

	// Without chunks, with the errors each classification cares about.
	inner := &scripted{errs: []error{
		&llm.Error{Retryable: true, Status: http.StatusTooManyRequests},
		&llm.Error{Retryable: true, Status: http.StatusServiceUnavailable},
		&llm.Error{Retryable: true, Status: http.StatusBadGateway},
		&llm.Error{Status: http.StatusBadRequest},
		fmt.Errorf("no upstream: %w", llm.ErrNoCapacity),
		context.Canceled,
		&llm.Error{Retryable: true, Err: llm.ErrFirstTokenTimeout},
		&llm.Error{Retryable: true, RetryAfter: time.Second, Err: fmt.Errorf("every upstream: %w", llm.ErrCircuitOpen)},
	}}
	calls = nil
	p = llm.Observe(inner, observe)
	for range 9 {
		_, _ = p.Stream(context.Background(), protocol.ChatRequest{}, func(protocol.Chunk) error { return nil })
	}
	type class struct{ throttled, counted, failed bool }
	want := []class{
		{true, true, true},   // 429
		{true, true, true},   // 503
		{false, true, true},  // 502
		{false, true, false}, // 400: the request's fault
		{false, false, false},
		{false, false, false},
		{false, true, true},   // first-token timeout
		{false, false, false}, // refused by open circuits: no call made
		{false, true, false},
	}
	if len(calls) != len(want) {
		t.Fatalf("%d calls observed, want %d", len(calls), len(want))
	}
	for i, c := range calls {
		if got := (class{c.Throttled(), c.Counted(), c.Failed()}); got != want[i] || c.Chunks {
			t.Errorf("call %d (%v): %+v chunks %v, want %+v and none", i, c.Err, got, c.Chunks, want[i])
		}
	}
}

// reserving is a Reserver whose reservations answer with two chunks.
type reserving struct{ chunky }

func (r reserving) Reserve(context.Context, protocol.ChatRequest) (llm.Reservation, error) {
	return reservation(r), nil
}

type reservation struct{ chunky }

func (reservation) Release() {}

// A Reserver stays one through Observe, and a call through its
// reservation is observed.
func TestObserveKeepsReserver(t *testing.T) {
	t.Parallel()
	var calls []llm.Call
	p := llm.Observe(reserving{chunky{pause: time.Millisecond}}, func(c llm.Call) { calls = append(calls, c) })
	rp, ok := p.(llm.Reserver)
	if !ok {
		t.Fatal("Observe hid the Reserver")
	}
	res, err := rp.Reserve(context.Background(), protocol.ChatRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Stream(context.Background(), protocol.ChatRequest{}, func(protocol.Chunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	res.Release()
	if len(calls) != 1 || !calls[0].Chunks {
		t.Fatalf("calls %+v, want the reservation's call observed", calls)
	}
	if _, ok := llm.Observe(chunky{}, func(llm.Call) {}).(llm.Reserver); ok {
		t.Error("a plain provider became a Reserver")
	}
}
