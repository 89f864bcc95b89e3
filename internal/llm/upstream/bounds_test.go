package upstream

import (
	"math"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
)

// The settings' ranges of Config and HealthConfig are *bounds.Errors
// naming the field, every one reported; the edges pass.
func TestConfigBounds(t *testing.T) {
	t.Parallel()
	if err := (Config{AffinityBalance: 1}).Validate(); err != nil {
		t.Errorf("edge Config: %v", err)
	}
	if err := (HealthConfig{MaxFails: 1, Cooldown: time.Millisecond}).Validate(); err != nil {
		t.Errorf("edge HealthConfig: %v", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"config", Config{AffinityBalance: math.NaN(), RetryAfterMax: -1, ProbeEvery: -1, NonTextPartTokens: -1}.Validate(),
			[]string{"AffinityBalance", "RetryAfterMax", "ProbeEvery", "NonTextPartTokens"}},
		{"zero balance", Config{}.Validate(), []string{"AffinityBalance"}},
		{"health", HealthConfig{}.Validate(), []string{"MaxFails", "Cooldown"}},
	} {
		got := bounds.Errors(tc.err)
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want bounds errors for %v", tc.name, tc.err, tc.want)
			continue
		}
		for i, e := range got {
			if e.Field != tc.want[i] {
				t.Errorf("%s: error %d names %s, want %s", tc.name, i, e.Field, tc.want[i])
			}
		}
	}
}
