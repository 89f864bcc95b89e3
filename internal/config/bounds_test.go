package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// Every setting whose range a component holds is reported under its own
// name when out of range: -1 (in its unit) is below every such range.
func TestComponentRangesNameEachSetting(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[Config]()
	n := 0
	for comp, fields := range boundFields {
		for field, i := range fields {
			name := envVars[typ.Field(i).Name]
			n++
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				c := mustLoad(t, "", nil)
				f := reflect.ValueOf(c).Elem().Field(i)
				switch {
				case f.Type() == reflect.TypeFor[time.Duration]():
					unit, _, _ := durationUnit(name)
					f.SetInt(-int64(unit))
				case f.CanInt():
					f.SetInt(-1)
				case f.CanFloat():
					f.SetFloat(-1)
				}
				err := c.Validate()
				var found bool
				for _, fe := range fieldErrors(err) {
					if fe.Var == name {
						found = true
						if !strings.HasPrefix(fe.Err.Error(), "(-1) must ") {
							t.Errorf("%s (%s.%s): %q, want it to start with the value in env", name, comp, field, fe)
						}
					}
				}
				if !found {
					t.Errorf("%s = -1 (%s.%s): Validate() = %v, want an error naming it", name, comp, field, err)
				}
			})
		}
	}
	if n < 40 {
		t.Errorf("%d settings have their range in a component, want at least 40", n)
	}
}

func fieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		if fe, ok := e.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		if u, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

// A component's bound is written as the setting is: in its unit, a
// minimum rounded up to a whole unit (env counts whole units).
func TestInSetting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		x       any
		minimum bool
		want    string
	}{
		{"WORKER_HEARTBEAT_SECONDS", time.Nanosecond, true, "1"},
		{"WORKER_HEARTBEAT_SECONDS", 1500 * time.Millisecond, false, "1.5"},
		{"ADAPTIVE_INTERVAL_MS", 100 * time.Millisecond, true, "100"},
		{"DEAD_LETTER_TTL_HOURS", time.Second, true, "1"},
		{"DEAD_LETTER_TTL_HOURS", 2 * time.Hour, true, "2"},
		{"QUEUE_SHED_LOW_FRACTION", 0.5, false, "0.5"},
		{"MAX_CHOICES", 8, false, "8"},
		{"QUEUE_MAX_BYTES", int64(1 << 20), false, "1048576"},
	} {
		if got := inSetting(tc.name, tc.x, tc.minimum); got != tc.want {
			t.Errorf("inSetting(%s, %v, %v) = %q, want %q", tc.name, tc.x, tc.minimum, got, tc.want)
		}
	}
}
