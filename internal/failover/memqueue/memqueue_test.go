package memqueue

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/failovertest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

func newQueue(tb testing.TB, idle time.Duration) *Queue {
	tb.Helper()
	q, err := New(Config{ReclaimIdle: idle})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return q
}

func TestSuite(t *testing.T) {
	failovertest.Run(t, func(t *testing.T) failovertest.Harness {
		const idle = 300 * time.Millisecond
		q := newQueue(t, idle)
		return failovertest.Harness{
			Producer:    q,
			Depth:       q,
			NewConsumer: func(name string) failover.Consumer { return q.Consumer(name) },
			ReclaimIdle: idle,
			DeadLetters: func(ctx context.Context) ([]failover.DeadLetter, error) { return q.DeadLetters(ctx, 1<<20) },
		}
	})
}

func TestValidate(t *testing.T) {
	t.Parallel()
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	if err := (Config{ReclaimIdle: -time.Second}).Validate(); err == nil {
		t.Error("negative ReclaimIdle accepted")
	}
	if _, err := New(Config{ReclaimIdle: -time.Second}); err == nil {
		t.Error("New accepted a negative ReclaimIdle")
	}
}

// TestTakeoverTimingInBubble pins the takeover to exactly ReclaimIdle on
// a fake clock: memqueue must be usable from synctest-based worker tests.
func TestTakeoverTimingInBubble(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(t, 15*time.Second)
		a, b := q.Consumer("a"), q.Consumer("b")
		// Fake time: a queue that never hands the job over fails at once.
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		if err := q.Enqueue(ctx, "r", []byte("job")); err != nil {
			t.Fatal(err)
		}
		d, err := a.Fetch(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// Touch at 10s pushes the takeover to 25s.
		testutil.AdvanceFakeClock(10 * time.Second)
		if err := a.Touch(ctx, d[0]); err != nil {
			t.Fatalf("Touch: %v", err)
		}
		got, err := b.Fetch(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took != 25*time.Second {
			t.Fatalf("taken over after %s, want 25s", took)
		}
		if got[0].Attempt != 2 || got[0].ID != d[0].ID {
			t.Fatalf("takeover = %+v, want attempt 2 of %s", got[0], d[0].ID)
		}
		if err := a.Touch(ctx, d[0]); !errors.Is(err, ErrClaimLost) {
			t.Fatalf("Touch by former owner = %v, want ErrClaimLost", err)
		}
	})
}

func TestDeadLetterOnce(t *testing.T) {
	t.Parallel()
	q := newQueue(t, time.Minute)
	c := q.Consumer("a")
	ctx := t.Context()
	if err := q.Enqueue(ctx, "r", []byte("job")); err != nil {
		t.Fatal(err)
	}
	ds, err := c.Fetch(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.DeadLetter(ctx, ds[0], "bad"); err != nil {
			t.Fatalf("DeadLetter: %v", err)
		}
	}
	if n, _ := q.DeadLetterDepth(ctx); n != 1 {
		t.Fatalf("DeadLetterDepth after two DeadLetter calls = %d, want 1", n)
	}
	// The record carries what every backend's does (failover.DeadLetter).
	dls, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadLetters = %+v, %v; want one", dls, err)
	}
	want := failover.DeadLetter{ID: "1", RequestID: "r", Body: []byte("job"),
		BodySHA1: "2eda8ad1632af052b0c74d6fcab6058b3a79cf25", BodyBytes: 3, Reason: "bad", Attempt: 1,
		Source: "memqueue delivery " + ds[0].ID}
	got := dls[0]
	if got.FailedAt.IsZero() {
		t.Errorf("FailedAt is zero")
	}
	got.FailedAt = time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("dead letter = %+v, want %+v", got, want)
	}
	if err := c.Touch(ctx, ds[0]); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("Touch after DeadLetter = %v, want ErrClaimLost", err)
	}
}

func TestEnqueueCopiesBody(t *testing.T) {
	t.Parallel()
	q := newQueue(t, time.Minute)
	ctx := t.Context()
	body := []byte("original")
	if err := q.Enqueue(ctx, "r", body); err != nil {
		t.Fatal(err)
	}
	copy(body, "mutated!")
	ds, err := q.Consumer("a").Fetch(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(ds[0].Body) != "original" {
		t.Fatalf("body = %q, want the bytes as enqueued", ds[0].Body)
	}
}
