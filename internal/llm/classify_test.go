package llm

import (
	"fmt"
	"testing"
)

// ErrNoCapacity (every upstream full) is retried at once, never counts
// against the breaker, and is labelled throttled.
func TestNoCapacity(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("upstream: none free: %w", ErrNoCapacity)
	if !IsRetryable(err) || CountsAgainstBreaker(err) || IsClientError(err) || Reason(err) != ReasonThrottled {
		t.Fatalf("retryable %v, breaker %v, client %v, reason %q", IsRetryable(err), CountsAgainstBreaker(err), IsClientError(err), Reason(err))
	}
	if d, ok := (RetryPolicy{}).Delay(err, 3); !ok || d != 0 {
		t.Fatalf("delay %s, %v; want 0, true", d, ok)
	}
	if CapacityWait(t.Context()) || !CapacityWait(WithCapacityWait(t.Context())) {
		t.Fatal("CapacityWait does not follow WithCapacityWait")
	}
}

// IsCircuitOpen recognises a breaker's refusal through any wrapping, and
// nothing else: not the provider's own failures, not ErrNoCapacity.
func TestIsCircuitOpen(t *testing.T) {
	t.Parallel()
	refusal := &Error{Retryable: true, Err: fmt.Errorf("breaker: provider p: %w", ErrCircuitOpen)}
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{refusal, true},
		{fmt.Errorf("upstream: %w", refusal), true},
		{nil, false},
		{&Error{Retryable: true, Status: 503}, false},
		{fmt.Errorf("upstream: %w", ErrNoCapacity), false},
	} {
		if got := IsCircuitOpen(tt.err); got != tt.want {
			t.Errorf("IsCircuitOpen(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
