package upstream

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// Caps, health and quotas of two processes on a 3-primary Redis Cluster:
// every key of an upstream carries one hash tag, so each multi-key script
// runs on one primary, and both processes see one count.
func TestSharedStateOnRedisCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	prefix := redistest.Prefix(t)
	ctx := context.Background()

	specs := []Spec{{Name: "gpu", MaxConcurrency: 2}}
	cfg := RedisConfig{Prefix: prefix}
	c1, c2 := newRedisCaps(t, cl.Client(t), specs, cfg), newRedisCaps(t, cl.Client(t), specs, cfg)
	s1, err := c1.TryAcquire(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c2.TryAcquire(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.TryAcquire(ctx, 0); err != ErrFull {
		t.Fatalf("third slot of a cap of 2 over two processes: %v, want ErrFull", err)
	}
	c2.Release(s2)
	testutil.Eventually(t, 10*time.Second, func() bool { return c1.Load(0) == 1 }, "release seen by the other process")
	s3, err := c1.TryAcquire(ctx, 0)
	if err != nil {
		t.Fatalf("slot after a release elsewhere: %v", err)
	}
	c1.Release(s1)
	c1.Release(s3)

	hspecs := []Spec{{Name: "a"}, {Name: "b"}}
	hcfg := HealthConfig{MaxFails: 3, Cooldown: time.Minute}
	h1 := newRedisHealth(t, cl.Client(t), hspecs, prefix, hcfg)
	h2 := newRedisHealth(t, cl.Client(t), hspecs, prefix, hcfg)
	for i, h := range []*RedisHealth{h1, h2, h1} {
		ej, err := h.Failed(ctx, 0, Failure{Reason: "503"})
		if err != nil || ej != (i == 2) {
			t.Fatalf("failure %d: ejected %v, %v", i+1, ej, err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return h2.State(0) == Ejected }, "ejection seen by the other process")
	if h2.State(1) != Healthy {
		t.Fatal("the other upstream was ejected too")
	}

	qspecs := []Spec{{Name: "hosted", RPM: 3, TPM: 1000}}
	var qs []*RedisQuota
	for range 2 {
		q, err := NewRedisQuota(cl.Client(t), qspecs, prefix, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, q)
	}
	granted := 0
	for i := range 6 {
		ok, _, err := qs[i%2].Reserve(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			granted++
		}
	}
	if granted != 3 {
		t.Fatalf("%d of 6 granted across two processes, want rpm 3", granted)
	}
}
