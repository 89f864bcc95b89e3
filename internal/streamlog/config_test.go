package streamlog_test

import (
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/streamlog"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TTL below 1s is a *bounds.Error naming it; 1s passes.
func TestConfigTTLBounds(t *testing.T) {
	t.Parallel()
	if err := (streamlog.Config{TTL: time.Second}).Validate(); err != nil {
		t.Errorf("TTL 1s: %v", err)
	}
	if err := (streamlog.Config{TTL: time.Second - time.Millisecond}).Validate(); !testutil.HasBound(err, "TTL") {
		t.Errorf("TTL 999ms: Validate() = %v, want a bounds error for TTL", err)
	}
}

// FlushInterval out of 1ms–1s is a *bounds.Error naming it; its ends and
// zero (the default) pass.
func TestConfigFlushIntervalBounds(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, time.Millisecond, streamlog.MaxFlushInterval} {
		if err := (streamlog.Config{TTL: time.Minute, FlushInterval: d}).Validate(); err != nil {
			t.Errorf("FlushInterval %v: %v", d, err)
		}
	}
	for _, d := range []time.Duration{-time.Millisecond, time.Millisecond - 1, streamlog.MaxFlushInterval + time.Millisecond} {
		if err := (streamlog.Config{TTL: time.Minute, FlushInterval: d}).Validate(); !testutil.HasBound(err, "FlushInterval") {
			t.Errorf("FlushInterval %v: Validate() = %v, want a bounds error for FlushInterval", d, err)
		}
	}
}
