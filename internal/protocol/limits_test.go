package protocol

import (
	"testing"

	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// A limit below 1 is a *bounds.Error naming it; 1 passes, as do the
// defaults.
func TestLimitsValidate(t *testing.T) {
	t.Parallel()
	for _, ok := range []Limits{DefaultLimits, {MaxMessages: 1, MaxTokens: 1, MaxChoices: 1}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	err := Limits{MaxMessages: 0, MaxTokens: -1, MaxChoices: 0}.Validate()
	for _, field := range []string{"MaxMessages", "MaxTokens", "MaxChoices"} {
		if !testutil.HasBound(err, field) {
			t.Errorf("Validate() = %v, want a bounds error for %s", err, field)
		}
	}
}
