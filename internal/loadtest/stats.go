package loadtest

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// maxSamples bounds the durations kept per series. Up to it percentiles are
// exact; beyond it a uniform reservoir sample stands in for the rest, and
// Max stays exact.
const maxSamples = 1_000_000

// Percentiles summarizes one series of durations, in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// sampler collects durations for percentiles. It is not safe for
// concurrent use.
type sampler struct {
	vals []time.Duration
	seen int64
	max  time.Duration
	rng  *rand.Rand
}

func newSampler(seed uint64) *sampler {
	return &sampler{rng: rand.New(rand.NewPCG(seed, 0x5eed))}
}

func (s *sampler) add(d time.Duration) {
	s.seen++
	s.max = max(s.max, d)
	if len(s.vals) < maxSamples {
		s.vals = append(s.vals, d)
		return
	}
	// Algorithm R: the n-th value replaces a random slot with probability
	// maxSamples/n, which keeps the sample uniform.
	if j := s.rng.Int64N(s.seen); j < maxSamples {
		s.vals[j] = d
	}
}

func (s *sampler) percentiles() Percentiles {
	sorted := slices.Clone(s.vals)
	slices.Sort(sorted)
	return Percentiles{
		P50: ms(percentile(sorted, 50)),
		P90: ms(percentile(sorted, 90)),
		P99: ms(percentile(sorted, 99)),
		Max: ms(s.max),
	}
}

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It returns 0 for an empty slice.
func percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(n) / 100))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

func ms(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}
