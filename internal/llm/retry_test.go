package llm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
)

// refusingUpstream answers every call with status and, when not empty,
// the Retry-After header retryAfter returns.
func refusingUpstream(tb testing.TB, status int, retryAfter func() string) *llm.OpenAI {
	tb.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := retryAfter(); v != "" {
			w.Header().Set("Retry-After", v)
		}
		http.Error(w, `{"error":{"message":"slow down"}}`, status)
	}))
	tb.Cleanup(hs.Close)
	return newClient(tb, llm.OpenAIConfig{BaseURL: hs.URL + "/v1"})
}

func callErr(tb testing.TB, c *llm.OpenAI) error {
	tb.Helper()
	_, _, err := stream(tb, tb.Context(), c, userReq("hi"))
	if err == nil {
		tb.Fatal("call succeeded, want a refusal")
	}
	return err
}

func TestRetryDelayHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		header func() string
		policy llm.RetryPolicy
		lo, hi time.Duration
		ladder bool // no usable Retry-After: lo and hi double per attempt
	}{
		{"429 seconds", 429, func() string { return "2" }, llm.RetryPolicy{}, 2 * time.Second, 2 * time.Second, false},
		{"503 seconds", 503, func() string { return "7" }, llm.RetryPolicy{}, 7 * time.Second, 7 * time.Second, false},
		{"429 above the default max", 429, func() string { return "120" }, llm.RetryPolicy{}, 30 * time.Second, 30 * time.Second, false},
		{"429 above a set max", 429, func() string { return "20" }, llm.RetryPolicy{RetryAfterMax: 10 * time.Second}, 10 * time.Second, 10 * time.Second, false},
		// An HTTP-date has whole seconds, and a moment passes between
		// writing and reading it.
		{"429 HTTP-date", 429, func() string { return time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat) },
			llm.RetryPolicy{}, 8 * time.Second, 10 * time.Second, false},
		{"429 HTTP-date beyond the max", 429, func() string { return time.Now().Add(time.Hour).UTC().Format(http.TimeFormat) },
			llm.RetryPolicy{}, 30 * time.Second, 30 * time.Second, false},
		{"429 HTTP-date past: the ladder", 429, func() string { return time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat) },
			llm.RetryPolicy{}, 2 * time.Second, 2 * time.Second, true},
		{"429 garbage: the ladder", 429, func() string { return "soon" }, llm.RetryPolicy{}, 2 * time.Second, 2 * time.Second, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := callErr(t, refusingUpstream(t, tc.status, tc.header))
			for attempt := 1; attempt <= 3; attempt++ { // Retry-After wins at every attempt
				d, ok := tc.policy.Delay(err, attempt)
				if !ok || d < tc.lo || d > tc.hi {
					t.Errorf("Delay(%v, %d) = %v, %v; want within [%v, %v]", err, attempt, d, ok, tc.lo, tc.hi)
				}
				if tc.ladder {
					tc.lo, tc.hi = 2*tc.lo, 2*tc.hi
				}
			}
		})
	}
}

func TestRetryDelayThrottledLadder(t *testing.T) {
	t.Parallel()
	for _, status := range []int{429, 503} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			err := callErr(t, refusingUpstream(t, status, func() string { return "" }))
			want := []time.Duration{2, 4, 8, 16, 30, 30, 30}
			for i, w := range want {
				if d, ok := (llm.RetryPolicy{}).Delay(err, i+1); !ok || d != w*time.Second {
					t.Errorf("attempt %d: Delay = %v, %v; want %v", i+1, d, ok, w*time.Second)
				}
			}
			// Tests shorten the ladder; its cap is RetryAfterMax.
			p := llm.RetryPolicy{ThrottleDelay: 10 * time.Millisecond, RetryAfterMax: 50 * time.Millisecond}
			for i, w := range []time.Duration{10, 20, 40, 50, 50} {
				if d, _ := p.Delay(err, i+1); d != w*time.Millisecond {
					t.Errorf("short ladder attempt %d: Delay = %v, want %v", i+1, d, w*time.Millisecond)
				}
			}
		})
	}
}

// TestRetryDelayOtherFailures: other retryable failures back off from
// BaseDelay to MaxDelay with ±50% jitter; others are not retried.
func TestRetryDelayOtherFailures(t *testing.T) {
	t.Parallel()
	err := callErr(t, refusingUpstream(t, http.StatusBadGateway, func() string { return "" }))
	for range 50 {
		for attempt, mid := range map[int]time.Duration{1: 100 * time.Millisecond, 3: 400 * time.Millisecond} {
			d, ok := (llm.RetryPolicy{}).Delay(err, attempt)
			if !ok || d < mid/2 || d > mid*3/2+time.Nanosecond {
				t.Fatalf("attempt %d: Delay = %v, %v; want within ±50%% of %v", attempt, d, ok, mid)
			}
		}
		if d, _ := (llm.RetryPolicy{}).Delay(err, 40); d > 5*time.Second || d < 2500*time.Millisecond {
			t.Fatalf("attempt 40: Delay = %v, want within [2.5s, 5s]", d)
		}
	}
	noRetry := map[string]error{
		"400":       callErr(t, refusingUpstream(t, http.StatusBadRequest, func() string { return "5" })),
		"401":       callErr(t, refusingUpstream(t, http.StatusUnauthorized, func() string { return "" })),
		"cancelled": fmt.Errorf("openai: read stream: %w", context.Canceled),
		"emit":      errors.New("downstream gone"),
	}
	for name, err := range noRetry {
		if d, ok := (llm.RetryPolicy{}).Delay(err, 1); ok {
			t.Errorf("%s: Delay = %v, true; want no retry", name, d)
		}
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    llm.RetryPolicy
		ok   bool
	}{
		{"zero: defaults", llm.RetryPolicy{}, true},
		{"negative max", llm.RetryPolicy{RetryAfterMax: -1}, false},
		{"negative throttle", llm.RetryPolicy{ThrottleDelay: -1}, false},
		{"negative base", llm.RetryPolicy{BaseDelay: -1}, false},
		{"negative max delay", llm.RetryPolicy{MaxDelay: -1}, false},
		{"max delay below base", llm.RetryPolicy{BaseDelay: time.Second, MaxDelay: time.Millisecond}, false},
		{"max below throttle", llm.RetryPolicy{RetryAfterMax: time.Second}, false},
	}
	for _, tc := range tests {
		if err := tc.p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestClassification lists how each kind of failure counts, with errors
// as the OpenAI client returns them where a real upstream can produce
// them.
func TestClassification(t *testing.T) {
	t.Parallel()
	status := func(code int) error { return callErr(t, refusingUpstream(t, code, func() string { return "" })) }
	refused := func() error {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return callErr(t, newClient(t, llm.OpenAIConfig{BaseURL: "http://" + addr + "/v1"}))
	}
	midstream := func(body string) error {
		return callErr(t, upstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, body)
		}))
	}
	timeout := func(sentinel error) error {
		return &llm.Error{Retryable: true, Err: fmt.Errorf("openai: x: %w", sentinel)}
	}
	tests := []struct {
		name                   string
		err                    error
		breaker, client, retry bool
		reason, code           string
		responded              bool
	}{
		{"nil", nil, false, false, false, "", "200", true},
		{"400", status(400), false, true, false, llm.ReasonClientError, "400", true},
		{"404", status(404), false, true, false, llm.ReasonClientError, "404", true},
		{"413", status(413), false, true, false, llm.ReasonClientError, "413", true},
		{"422", status(422), false, true, false, llm.ReasonClientError, "422", true},
		{"401", status(401), true, false, false, llm.ReasonRejected, "401", true},
		{"403", status(403), true, false, false, llm.ReasonRejected, "403", true},
		{"429", status(429), false, false, true, llm.ReasonThrottled, "429", true},
		{"503", status(503), true, false, true, llm.ReasonThrottled, "503", true},
		{"500", status(500), true, false, true, llm.ReasonServerError, "500", true},
		{"502", status(502), true, false, true, llm.ReasonServerError, "502", true},
		{"refused", refused(), true, false, true, llm.ReasonConnection, "", false},
		{"cut mid-stream", midstream(contentEvent("a")), true, false, true, llm.ReasonConnection, "200", true},
		{"error event", midstream("data: {\"error\":{\"message\":\"overloaded\"}}\n\n"), true, false, true, llm.ReasonServerError, "200", true},
		{"malformed event", midstream("data: {nope\n\n"), true, false, false, llm.ReasonBadResponse, "200", true},
		{"first-token timeout", timeout(llm.ErrFirstTokenTimeout), true, false, true, llm.ReasonTimeout, "", false},
		{"idle timeout", timeout(llm.ErrIdleTimeout), false, false, true, llm.ReasonTimeout, "", false},
		{"total timeout", timeout(llm.ErrTotalTimeout), false, false, true, llm.ReasonTimeout, "", false},
		{"cancelled", fmt.Errorf("openai: send: %w", context.Canceled), false, false, false, llm.ReasonCancelled, "", false},
		{"caller deadline", fmt.Errorf("sim: %w", context.DeadlineExceeded), false, false, false, llm.ReasonCancelled, "", false},
		{"emit error", fmt.Errorf("openai: emit chunk 2: %w", errors.New("client gone")), false, false, false, llm.ReasonOther, "", false},
	}
	for _, tc := range tests {
		if got := llm.CountsAgainstBreaker(tc.err); got != tc.breaker {
			t.Errorf("%s: CountsAgainstBreaker(%v) = %v, want %v", tc.name, tc.err, got, tc.breaker)
		}
		if got := llm.IsClientError(tc.err); got != tc.client {
			t.Errorf("%s: IsClientError(%v) = %v, want %v", tc.name, tc.err, got, tc.client)
		}
		if got := llm.IsRetryable(tc.err); got != tc.retry {
			t.Errorf("%s: IsRetryable(%v) = %v, want %v", tc.name, tc.err, got, tc.retry)
		}
		if got := llm.Reason(tc.err); got != tc.reason {
			t.Errorf("%s: Reason(%v) = %q, want %q", tc.name, tc.err, got, tc.reason)
		}
		if code, ok := llm.ResponseCode(tc.err); code != tc.code || ok != tc.responded {
			t.Errorf("%s: ResponseCode(%v) = %q, %v; want %q, %v", tc.name, tc.err, code, ok, tc.code, tc.responded)
		}
	}
}
