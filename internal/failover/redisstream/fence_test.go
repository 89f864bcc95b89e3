package redisstream

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/internal/failover"
	"github.com/spillway-dev/spillway/internal/testkit/redistest"
	"github.com/spillway-dev/spillway/internal/testkit/testutil"
)

// TestStalledMemberCannotSettle: after another member took a job over, the
// stalled member's Ack and DeadLetter fail with ErrClaimLost and leave the
// entry to the new owner, who can still refresh and acknowledge it.
func TestStalledMemberCannotSettle(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	prefix := redistest.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := newQueue(t, client, prefix, "a"), newQueue(t, client, prefix, "b")
	if err := a.Enqueue(ctx, "req-1", []byte("job")); err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	da, err := a.Fetch(ctx, 1)
	if err != nil || len(da) != 1 {
		t.Fatalf("a.Fetch: %v, %v", da, err)
	}
	var db []failover.Delivery
	testutil.Eventually(t, 10*time.Second, func() bool {
		fctx, fcancel := context.WithTimeout(ctx, testIdle)
		defer fcancel()
		ds, _ := b.Fetch(fctx, 1)
		db = ds
		return len(ds) == 1
	}, "b takes the job over")
	if db[0].Attempt != 2 {
		t.Fatalf("takeover attempt %d, want 2", db[0].Attempt)
	}
	if err := a.Ack(ctx, da[0]); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("stalled member's Ack: %v, want ErrClaimLost", err)
	}
	if err := a.DeadLetter(ctx, da[0], "stalled"); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("stalled member's DeadLetter: %v, want ErrClaimLost", err)
	}
	if err := a.Touch(ctx, da[0]); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("stalled member's Touch: %v, want ErrClaimLost", err)
	}
	if n, err := a.DeadLetterDepth(ctx); err != nil || n != 0 {
		t.Fatalf("dead letters %d, %v; want none", n, err)
	}
	if err := b.Touch(ctx, db[0]); err != nil {
		t.Fatalf("new owner's Touch: %v", err)
	}
	if err := b.Ack(ctx, db[0]); err != nil {
		t.Fatalf("new owner's Ack: %v", err)
	}
	if n, err := b.Depth(ctx); err != nil || n != 0 {
		t.Fatalf("depth %d, %v after the owner's Ack; want 0", n, err)
	}
	// A retried Ack after a lost reply is harmless.
	if err := b.Ack(ctx, db[0]); err != nil {
		t.Fatalf("repeated Ack: %v", err)
	}
}

// TestDeadLettersBounded: by default a dead letter keeps the job's digest
// and size, not the prompt; the stream is trimmed near DeadLetterMaxLen
// and expires DeadLetterTTL after its last record.
func TestDeadLettersBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	prefix := redistest.Prefix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := New(Config{Prefix: prefix, Consumer: "a", ReclaimIdle: testIdle, DeadLetterMaxLen: 10, DeadLetterTTL: time.Hour}, client)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	const jobs = 300
	body := []byte(`{"secret prompt":"do not keep me"}`)
	for i := range jobs {
		if err := q.Enqueue(ctx, "req", body); err != nil {
			t.Fatalf("Enqueue %d: %v", i, err)
		}
	}
	for n := 0; n < jobs; {
		ds, err := q.Fetch(ctx, 100)
		if err != nil {
			t.Fatalf("Fetch: %v", err)
		}
		for _, d := range ds {
			if err := q.DeadLetter(ctx, d, "test"); err != nil {
				t.Fatalf("DeadLetter: %v", err)
			}
			n++
		}
	}
	n, err := q.DeadLetterDepth(ctx)
	if err != nil || n < 10 || n >= jobs/2 {
		t.Fatalf("dead-letter stream holds %d (%v) after %d dead letters, want about 10 (MAXLEN ~ 10)", n, err, jobs)
	}
	dls, err := q.DeadLetters(ctx, 1)
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadLetters: %v, %v", dls, err)
	}
	if d := dls[0]; len(d.Body) != 0 || d.BodyBytes != len(body) || d.BodySHA1 != fmt.Sprintf("%x", sha1.Sum(body)) {
		t.Errorf("dead letter %+v, want no body, size %d and a SHA-1", d, len(body))
	}
	ttl, err := client.TTL(ctx, DeadLetterKey(prefix)).Result()
	if err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("dead-letter stream TTL %v (%v), want about 1h", ttl, err)
	}
}
