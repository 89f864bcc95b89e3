package admission

import (
	"math"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
)

// Each Config's fields out of range are *bounds.Errors naming the field,
// every one reported; a rule between two fields is a plain error.
func TestConfigBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		err   error
		want  []string
		plain bool // a rule between two fields fails too
	}{
		{"overflow edges", OverflowConfig{Threshold: 1, Hysteresis: 0, RefreshEvery: MinOverflowRefreshEvery,
			RetryAfterMax: time.Second, ShedLowFraction: 1, ShedNormalFraction: 1}.Validate(), nil, false},
		{"overflow", OverflowConfig{Threshold: 0, Hysteresis: -1, RefreshEvery: MinOverflowRefreshEvery - 1,
			RetryAfterMax: time.Second - 1, ShedLowFraction: 0}.Validate(),
			[]string{"Threshold", "Hysteresis", "RefreshEvery", "RetryAfterMax", "ShedLowFraction"}, false},
		{"overflow NaN fraction", OverflowConfig{}.withDefaults().withShedLow(math.NaN()).Validate(), []string{"ShedLowFraction"}, false},
		{"overflow hysteresis at threshold", OverflowConfig{Threshold: 5, Hysteresis: 5}.withDefaults().Validate(), nil, true},
		{"degrade edges", DegradeConfig{MaxTokens: 1, MinRequests: 1, ProbeEvery: 1, RetryAfterMax: time.Second}.Validate(), nil, false},
		{"degrade", DegradeConfig{Hold: -1, RaiseAfter: -1}.Validate(),
			[]string{"MaxTokens", "MinRequests", "ProbeEvery", "Hold", "RaiseAfter", "RetryAfterMax"}, false},
		{"quota edges", QuotaConfig{Prefix: "p", MaxPerIdentity: 1}.Validate(), nil, false},
		{"quota", QuotaConfig{Prefix: "p", MaxBytes: -1, RetryAfter: -1}.Validate(), []string{"MaxPerIdentity", "MaxBytes", "RetryAfter"}, false},
		{"rate limit edges", RateLimitConfig{RPS: maxRPS, Burst: 0}.Validate(), nil, false},
		{"rate limit", RateLimitConfig{RPS: math.Inf(1), Burst: -1}.Validate(), []string{"Burst", "RPS"}, false},
		{"rate limit too fast", RateLimitConfig{RPS: 2 * maxRPS}.Validate(), []string{"RPS"}, false},
	}
	for _, tt := range tests {
		got := bounds.Errors(tt.err)
		if len(got) != len(tt.want) {
			t.Errorf("%s: %v, want bounds errors for %v", tt.name, tt.err, tt.want)
			continue
		}
		for i, e := range got {
			if e.Field != tt.want[i] {
				t.Errorf("%s: error %d names %s, want %s", tt.name, i, e.Field, tt.want[i])
			}
		}
		if tt.plain != (tt.err != nil && len(got) == 0) {
			t.Errorf("%s: %v, want a plain error %v", tt.name, tt.err, tt.plain)
		}
	}
}

func (c OverflowConfig) withShedLow(f float64) OverflowConfig { c.ShedLowFraction = f; return c }
