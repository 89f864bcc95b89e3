package redistest

import (
	"context"
	"testing"
)

func TestStartServesAndStops(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, Prefix(t)+"k", "v", 0).Err(); err != nil {
		t.Fatalf("set: %v", err)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded after Stop")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after Restart: %v", err)
	}
}
