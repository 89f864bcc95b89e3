package bounds

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

func TestRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want string // "" when the value is in range
	}{
		{"at least, equal", AtLeast("N", 1, 1), ""},
		{"at least, below", AtLeast("N", 0, 1), "N (0) must be at least 1"},
		{"at least, duration", AtLeast("D", time.Second, 2*time.Second), "D (1s) must be at least 2s"},
		{"at least, NaN", AtLeast("F", math.NaN(), 0), "F (NaN) must be at least 0"},
		{"at most, equal", AtMost("N", int64(64), 64), ""},
		{"at most, above", AtMost("N", 65, 64), "N (65) must be at most 64"},
		{"fraction, ends", errors.Join(Fraction("R", 0), Fraction("R", 1)), ""},
		{"fraction, above", Fraction("R", 1.5), "R (1.5) must be between 0 and 1"},
		{"fraction, NaN", Fraction("R", math.NaN()), "R (NaN) must be between 0 and 1"},
	}
	for _, tt := range tests {
		switch {
		case tt.want == "" && tt.err != nil:
			t.Errorf("%s: %v, want nil", tt.name, tt.err)
		case tt.want != "" && (tt.err == nil || tt.err.Error() != tt.want):
			t.Errorf("%s: %v, want %q", tt.name, tt.err, tt.want)
		}
	}
}

// Errors finds every *Error however the component wrapped and joined them.
func TestErrorsWalksTheTree(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("pkg: config: %w", errors.Join(
		AtLeast("A", 0, 1),
		errors.New("a rule between two fields"),
		fmt.Errorf("nested: %w", errors.Join(AtMost("B", 2, 1))),
	))
	got := Errors(err)
	if len(got) != 2 || got[0].Field != "A" || got[1].Field != "B" {
		t.Fatalf("Errors() = %v, want A and B", got)
	}
	if got[0].Value != 0 || got[0].Rule != RuleAtLeast || got[0].Bounds[0] != 1 {
		t.Errorf("Errors()[0] = %+v, want value 0, RuleAtLeast, bound 1", got[0])
	}
	if Errors(nil) != nil || Errors(errors.New("plain")) != nil {
		t.Error("Errors found a bounds error in nil or a plain error")
	}
}
