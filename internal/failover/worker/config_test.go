package worker

import (
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Each field out of range is a *bounds.Error naming it, all reported
// together; the smallest values pass.
func TestConfigBounds(t *testing.T) {
	t.Parallel()
	edge := Config{Concurrency: 1, Heartbeat: time.Nanosecond, BatchSize: 1, BatchTimeout: time.Nanosecond, QueueTimeout: time.Nanosecond}
	if err := edge.Validate(); err != nil {
		t.Fatalf("smallest values: %v", err)
	}
	bad := Config{Concurrency: 0, Heartbeat: 0, BatchSize: 0, BatchTimeout: -1, MaxRetries: -1, QueueTimeout: 0, StopGrace: -1}
	err := bad.Validate()
	want := []string{"Concurrency", "BatchSize", "MaxRetries", "Heartbeat", "BatchTimeout", "QueueTimeout", "StopGrace"}
	for _, field := range want {
		if !testutil.HasBound(err, field) {
			t.Errorf("Validate() = %v, want a bounds error for %s", err, field)
		}
	}
	if n := len(bounds.Errors(err)); n != len(want) {
		t.Errorf("Validate() gave %d bounds errors, want %d: %v", n, len(want), err)
	}
	// ReclaimIdle against Heartbeat is a rule between two fields.
	cross := edge
	cross.Heartbeat, cross.ReclaimIdle = time.Second, time.Second
	if err := cross.Validate(); err == nil || len(bounds.Errors(err)) != 0 {
		t.Errorf("Validate() = %v, want one plain error", err)
	}
}
