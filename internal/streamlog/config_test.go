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
