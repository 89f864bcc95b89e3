package stream_test

import (
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/bounds"
	"github.com/spillway-dev/spillway/internal/protocol"
	"github.com/spillway-dev/spillway/internal/stream"
)

// The settings' ranges are *bounds.Errors naming the field, every one
// reported; the edges pass.
func TestConfigBounds(t *testing.T) {
	t.Parallel()
	edge := stream.Config{MaxBodyBytes: 1, BodyBytesInFlight: stream.MaxBodyBytesInFlight, Limits: protocol.DefaultLimits,
		Heartbeat: time.Nanosecond, BodyReadTimeout: time.Nanosecond, ResumeWindow: 0}
	if err := edge.Validate(); err != nil {
		t.Errorf("edge values: %v", err)
	}
	bad := edge
	bad.Heartbeat, bad.BodyReadTimeout, bad.ResumeWindow, bad.BodyBytesInFlight = 0, 0, -time.Second, stream.MaxBodyBytesInFlight+1
	err := bad.Validate()
	want := []string{"Heartbeat", "BodyReadTimeout", "ResumeWindow", "BodyBytesInFlight"}
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
