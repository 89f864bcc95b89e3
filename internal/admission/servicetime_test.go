package admission

import (
	"testing"
	"time"
)

func TestServiceTimeRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name              string
		mean              time.Duration
		queueAhead, slots int
		want              time.Duration
	}{
		{"nothing ahead, one slot", 10 * time.Second, 0, 1, 10 * time.Second},
		{"seven ahead, four slots", 10 * time.Second, 7, 4, 20 * time.Second},
		{"nothing ahead, many slots clamps to 1s", 10 * time.Second, 0, 100, time.Second},
		{"long queue clamps to max", 10 * time.Second, 1000, 1, time.Minute},
		{"zero slots counts as one", 2 * time.Second, 4, 0, 10 * time.Second},
		{"negative queue counts as empty", 3 * time.Second, -5, 1, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := NewServiceTime(tt.mean, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.RetryAfter(tt.queueAhead, tt.slots); got != tt.want {
				t.Fatalf("RetryAfter(%d, %d) with mean %v = %v, want %v", tt.queueAhead, tt.slots, tt.mean, got, tt.want)
			}
		})
	}
}

func TestServiceTimeObserve(t *testing.T) {
	t.Parallel()
	s, err := NewServiceTime(30*time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s.Observe(0)
	s.Observe(-time.Second)
	if got := s.Mean(); got != 30*time.Second {
		t.Fatalf("Mean after ignored observations = %v, want the initial 30s", got)
	}
	s.Observe(4 * time.Second)
	if got := s.Mean(); got != 4*time.Second {
		t.Fatalf("Mean after the first observation = %v, want it to replace the guess: 4s", got)
	}
	s.Observe(14 * time.Second) // 4 + 0.1×(14−4)
	if got := s.Mean(); got != 5*time.Second {
		t.Fatalf("Mean after 4s then 14s = %v, want 5s", got)
	}
	for range 200 {
		s.Observe(8 * time.Second)
	}
	if got := s.Mean(); got < 8*time.Second-time.Millisecond || got > 8*time.Second+time.Millisecond {
		t.Fatalf("Mean after many 8s streams = %v, want ≈8s", got)
	}
	if got := s.RetryAfter(3, 2); got < 16*time.Second-2*time.Millisecond || got > 16*time.Second+2*time.Millisecond {
		t.Fatalf("RetryAfter(3, 2) with mean 8s = %v, want ≈16s", got)
	}
}

func TestNewServiceTimeRejects(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ initial, max time.Duration }{{0, time.Minute}, {time.Second, 0}, {time.Second, 999 * time.Millisecond}} {
		if _, err := NewServiceTime(c.initial, c.max); err == nil {
			t.Errorf("NewServiceTime(%v, %v) succeeded, want an error", c.initial, c.max)
		}
	}
}
