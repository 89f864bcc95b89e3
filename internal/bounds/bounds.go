// Package bounds states the range of a component Config's fields as
// errors that name the field, so that internal/config can report each
// under the name of the setting it comes from, with its value and rule.
// It imports nothing of the module.
package bounds

import "fmt"

// Rules of AtLeast and AtMost; config renders their bounds in the unit of
// the setting.
const (
	// RuleAtLeast is the rule of AtLeast.
	RuleAtLeast = "must be at least %v"
	// RuleAtMost is the rule of AtMost.
	RuleAtMost = "must be at most %v"
)

// Error is one field of a component's Config outside its range. A
// component's Validate joins one per bad field with errors.Join (it may
// wrap the whole); a rule between two fields is a plain error instead.
type Error struct {
	// Field is the Go name of the field, e.g. "PerUser".
	Field string
	// Value is the field's value.
	Value any
	// Rule is what the value must be, with a %v for each of Bounds, e.g.
	// RuleAtLeast. It follows the value in a sentence.
	Rule string
	// Bounds are the limits Rule names, of Value's type.
	Bounds []any
}

// Error returns the field, its value and the rule:
// "PerUser (0) must be at least 1".
func (e *Error) Error() string {
	return fmt.Sprintf("%s (%v) %s", e.Field, e.Value, fmt.Sprintf(e.Rule, e.Bounds...))
}

// Number is a field type a bound compares: counts, sizes, durations and
// fractions.
type Number interface {
	~int | ~int64 | ~float64
}

// AtLeast returns an *Error when got is below minimum (or NaN), else nil.
func AtLeast[T Number](field string, got, minimum T) error {
	if got >= minimum {
		return nil
	}
	return &Error{Field: field, Value: got, Rule: RuleAtLeast, Bounds: []any{minimum}}
}

// AtMost returns an *Error when got is above maximum (or NaN), else nil.
func AtMost[T Number](field string, got, maximum T) error {
	if got <= maximum {
		return nil
	}
	return &Error{Field: field, Value: got, Rule: RuleAtMost, Bounds: []any{maximum}}
}

// Fraction returns an *Error unless got is between 0 and 1, inclusive.
func Fraction(field string, got float64) error {
	if got >= 0 && got <= 1 { // written so NaN fails too
		return nil
	}
	return &Error{Field: field, Value: got, Rule: "must be between %v and %v", Bounds: []any{0.0, 1.0}}
}

// Errors returns every *Error in err's tree (errors.Join and %w wrapping),
// in order.
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(e error) {
		if be, ok := e.(*Error); ok {
			out = append(out, be)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			if x := u.Unwrap(); x != nil {
				walk(x)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}
