package upstream

import (
	"fmt"
	"math"
	"testing"
	"time"
)

func TestWeightedFollowsWeights(t *testing.T) {
	t.Parallel()
	ups := fakeUps(5, 3, 2)
	r, err := NewRouter(RoutingWeighted, len(ups), 0)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, len(ups))
	const picks = 1000
	for range picks {
		counts[r.Pick(ups, Choice{Eligible: all(3)})]++
	}
	for i, w := range []float64{.5, .3, .2} {
		share := float64(counts[i]) / picks
		if math.Abs(share-w) > 0.02 {
			t.Errorf("upstream %d: share %.3f, want %.2f ± 0.02 (counts %v)", i, share, w, counts)
		}
	}
	// Smooth: the heaviest never gets more than its weight in a row.
	run, longest, last := 0, 0, -1
	for range 100 {
		i := r.Pick(ups, Choice{Eligible: all(3)})
		if i == last {
			run++
		} else {
			run = 1
		}
		last, longest = i, max(longest, run)
	}
	if longest > 2 {
		t.Errorf("longest run on one upstream %d, want at most 2 for weights 5:3:2", longest)
	}
	// Only eligible upstreams are picked.
	for range 50 {
		if i := r.Pick(ups, Choice{Eligible: 0b010}); i != 1 {
			t.Fatalf("picked %d, only 1 is eligible", i)
		}
	}
	if i := r.Pick(ups, Choice{}); i != -1 {
		t.Fatalf("picked %d with none eligible", i)
	}
}

func TestLeastLoadedPicksLowestPerWeightWithRandomTies(t *testing.T) {
	t.Parallel()
	ups := fakeUps(1, 2, 1)
	ups[0].local.Store(3)
	ups[1].local.Store(4) // 2 per weight: the least loaded
	ups[2].local.Store(5)
	r, _ := NewRouter(RoutingLeastLoaded, 3, 0)
	if i := r.Pick(ups, Choice{Eligible: all(3)}); i != 1 {
		t.Fatalf("picked %d, want 1", i)
	}
	ups[1].local.Store(6) // 3 per weight: tie with upstream 0
	seen := map[int]int{}
	for range 400 {
		seen[r.Pick(ups, Choice{Eligible: all(3)})]++
	}
	if seen[2] != 0 || seen[0] < 120 || seen[1] < 120 {
		t.Fatalf("ties not broken at random between 0 and 1: %v", seen)
	}
}

func sessions(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("session-%d", i)
	}
	return keys
}

func TestAffinityStableAndMovesOnlyLostShare(t *testing.T) {
	t.Parallel()
	ups := fakeUps(1, 1, 1, 1)
	r, _ := NewRouter(RoutingAffinity, len(ups), 0)
	keys := sessions(2000)
	before := make([]int, len(keys))
	counts := make([]int, len(ups))
	for k, key := range keys {
		before[k] = r.Pick(ups, Choice{Eligible: all(4), Key: key})
		counts[before[k]]++
		for range 3 {
			if again := r.Pick(ups, Choice{Eligible: all(4), Key: key}); again != before[k] {
				t.Fatalf("session %s moved from %d to %d with nothing changed", key, before[k], again)
			}
		}
	}
	for i, c := range counts {
		if c < 400 || c > 600 {
			t.Errorf("upstream %d holds %d of 2000 sessions, want about 500", i, c)
		}
	}
	// Upstream 2 is ejected: only its sessions move.
	moved, movedOthers := 0, 0
	for k, key := range keys {
		now := r.Pick(ups, Choice{Eligible: all(4) &^ (1 << 2), Key: key})
		if now == before[k] {
			continue
		}
		moved++
		if before[k] != 2 {
			movedOthers++
		}
	}
	frac := float64(moved) / float64(len(keys))
	t.Logf("ejecting 1 of 4 upstreams moved %.1f%% of sessions (its share %.1f%%)", 100*frac, 100*float64(counts[2])/2000)
	if movedOthers != 0 || moved != counts[2] {
		t.Fatalf("moved %d sessions (%d not on the lost upstream), want exactly its %d", moved, movedOthers, counts[2])
	}
	// Back again: every session returns home.
	for k, key := range keys {
		if now := r.Pick(ups, Choice{Eligible: all(4), Key: key}); now != before[k] {
			t.Fatalf("session %s did not return to %d", key, before[k])
		}
	}
}

func TestAffinityBalanceEscape(t *testing.T) {
	t.Parallel()
	ups := fakeUps(1, 1)
	r, _ := NewRouter(RoutingAffinity, 2, 1.5)
	key := "s"
	home := r.Pick(ups, Choice{Eligible: all(2), Key: key})
	other := 1 - home
	cases := []struct {
		home, other int64
		want        int
	}{
		{home: 5, other: 0, want: other},  // 5 > 1.5×0 and 5 more
		{home: 3, other: 0, want: home},   // fewer than 4 more
		{home: 12, other: 8, want: home},  // 4 more but not above 1.5×8
		{home: 13, other: 8, want: other}, // above 12 and 5 more
	}
	for _, c := range cases {
		ups[home].local.Store(c.home)
		ups[other].local.Store(c.other)
		if got := r.Pick(ups, Choice{Eligible: all(2), Key: key}); got != c.want {
			t.Errorf("home %d in flight, other %d: picked %d, want %d", c.home, c.other, got, c.want)
		}
	}
	if _, err := NewRouter(RoutingAffinity, 2, 0.5); err == nil {
		t.Error("balance 0.5 accepted")
	}
	if _, err := NewRouter("round-robin", 2, 0); err == nil {
		t.Error("unknown routing accepted")
	}
}

func TestLatencyPrefersFaster(t *testing.T) {
	t.Parallel()
	ups := fakeUps(1, 1, 1)
	now := time.Now()
	ups[0].lat.observe(300*time.Millisecond, now)
	ups[1].lat.observe(20*time.Millisecond, now)
	ups[2].lat.observe(150*time.Millisecond, now)
	r, _ := NewRouter(RoutingLatency, 3, 0)
	counts := make([]int, 3)
	for range 900 {
		counts[r.Pick(ups, Choice{Eligible: all(3)})]++
	}
	// Two of three draws include the fastest, which then always wins.
	if counts[1] < 500 || counts[0] != 0 {
		t.Fatalf("picks %v: the 20ms upstream should take about 2/3 and the slowest none", counts)
	}
	// Load counts: the fast one with 20 in flight loses to the 150ms idle one.
	ups[1].local.Store(20)
	counts = make([]int, 3)
	for range 300 {
		counts[r.Pick(ups, Choice{Eligible: 0b110})]++
	}
	if counts[2] != 300 {
		t.Fatalf("picks %v: 20ms × 21 should lose to 150ms × 1", counts)
	}
}

func TestPeakEWMA(t *testing.T) {
	t.Parallel()
	var e peakEWMA
	t0 := time.Now()
	e.observe(100*time.Millisecond, t0)
	e.observe(time.Second, t0.Add(time.Second)) // peak taken at once
	if v := e.valueAt(t0.Add(time.Second)); v != 1 {
		t.Fatalf("after a peak: %v, want 1", v)
	}
	e.observe(100*time.Millisecond, t0.Add(2*time.Second)) // decays gradually
	if v := e.valueAt(t0.Add(2 * time.Second)); v <= 0.8 || v >= 1 {
		t.Fatalf("one fast sample 1s later: %v, want between 0.8 and 1", v)
	}
	e.observe(100*time.Millisecond, t0.Add(60*time.Second))
	if v := e.valueAt(t0.Add(60 * time.Second)); v > 0.11 {
		t.Fatalf("after a minute: %v, want about 0.1", v)
	}
	// Unobserved, the cost decays on reading: a peak of 1s reads about
	// 0.37s 10s later, so an upstream avoided after one slow call is
	// tried again.
	e.observe(time.Second, t0.Add(61*time.Second))
	if v := e.valueAt(t0.Add(71 * time.Second)); math.Abs(v-math.Exp(-1)) > 0.01 {
		t.Fatalf("10s after a 1s peak without observations: %v, want about 0.37", v)
	}
}
