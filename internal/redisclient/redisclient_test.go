package redisclient

import (
	"testing"

	"github.com/spillway-dev/spillway/internal/bounds"
)

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	defaults := Options{DialTimeout: DefaultDialTimeout, Timeout: DefaultTimeout, PoolTimeout: DefaultPoolTimeout}
	edge := Options{PoolSize: 0, MinIdleConns: 0, DialTimeout: MinTimeout, Timeout: MinTimeout, PoolTimeout: MinTimeout}
	for _, o := range []Options{defaults, edge} {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
	bad := Options{PoolSize: -1, MinIdleConns: -1, DialTimeout: MinTimeout - 1, Timeout: 0, PoolTimeout: -1}
	err := bad.Validate()
	want := []string{"PoolSize", "MinIdleConns", "DialTimeout", "Timeout", "PoolTimeout"}
	got := bounds.Errors(err)
	if len(got) != len(want) {
		t.Fatalf("Validate() = %v, want bounds errors for %v", err, want)
	}
	for i, e := range got {
		if e.Field != want[i] {
			t.Errorf("error %d names %s, want %s", i, e.Field, want[i])
		}
	}
}
