package upstream

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
)

// Routing policies, the values of LLM_ROUTING.
const (
	// RoutingLeastLoaded sends each call to the upstream with the fewest
	// calls in flight for its weight, ties at random. The default: it needs
	// no tuning and adapts at once to replicas of different speed, since a
	// slow replica holds its calls longer.
	RoutingLeastLoaded = "least-loaded"
	// RoutingWeighted is smooth weighted round-robin (as nginx does it):
	// shares exactly proportional to the weights, evenly interleaved. For
	// a primary account and a spare, or to steer a fixed share of traffic.
	RoutingWeighted = "weighted"
	// RoutingAffinity keeps a session on one upstream (rendezvous hashing
	// of the session key over the eligible upstreams) so a replica's KV
	// cache of the conversation is reused; it gives way to the least
	// loaded upstream when the chosen one is much busier.
	RoutingAffinity = "affinity"
	// RoutingLatency is power of two choices on peak-EWMA first-chunk
	// latency × (calls in flight + 1), as Finagle and Linkerd balance: for
	// fleets of mixed hardware or regions.
	RoutingLatency = "latency"
)

// DefaultAffinityBalance is the default LLM_AFFINITY_BALANCE.
const DefaultAffinityBalance = 1.5

// affinityMinGap is how many more calls than the least loaded the
// affinity choice must have before it gives way: small counts are noise.
const affinityMinGap = 4

// Choice is what a Router picks from.
type Choice struct {
	// Eligible has bit i set when upstream i may take the call now:
	// healthy, serving the model, under its cap and quota, not tried yet.
	Eligible uint64
	// Key is the session key for affinity; empty means none.
	Key string
}

// Router picks one upstream per call. Pick returns the index of an upstream
// whose bit is set in c.Eligible, or -1 when none is. It does no I/O, runs
// in O(len(ups)) and is safe for concurrent use.
type Router interface {
	Pick(ups []*Upstream, c Choice) int
}

// NewRouter returns the router named by routing (Routing* constants) for n
// upstreams. balance is LLM_AFFINITY_BALANCE (0 means the default; it must
// be at least 1).
func NewRouter(routing string, n int, balance float64) (Router, error) {
	if balance == 0 {
		balance = DefaultAffinityBalance
	}
	if math.IsNaN(balance) || balance < 1 {
		return nil, fmt.Errorf("upstream: affinity balance %v must be at least 1", balance)
	}
	switch routing {
	case RoutingLeastLoaded, "":
		return leastLoaded{}, nil
	case RoutingWeighted:
		return &weighted{current: make([]int64, n)}, nil
	case RoutingAffinity:
		return affinity{balance: balance}, nil
	case RoutingLatency:
		return latency{}, nil
	}
	return nil, fmt.Errorf("upstream: routing %q must be %s, %s, %s or %s",
		routing, RoutingLeastLoaded, RoutingWeighted, RoutingAffinity, RoutingLatency)
}

type leastLoaded struct{}

func (leastLoaded) Pick(ups []*Upstream, c Choice) int {
	return pickLeastLoaded(ups, c.Eligible)
}

// pickLeastLoaded returns the eligible upstream with the lowest
// load/weight, one of several equal ones uniformly at random (reservoir
// sampling, so no list is built).
func pickLeastLoaded(ups []*Upstream, eligible uint64) int {
	best, ties := -1, 0
	var bestLoad, bestWeight int64
	for m := eligible; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		load, w := int64(ups[i].Load()), int64(ups[i].Spec.Weight)
		switch {
		case best < 0 || load*bestWeight < bestLoad*w:
			best, ties, bestLoad, bestWeight = i, 1, load, w
		case load*bestWeight == bestLoad*w:
			ties++
			if rand.IntN(ties) == 0 {
				best, bestLoad, bestWeight = i, load, w
			}
		}
	}
	return best
}

// weighted is smooth weighted round-robin: every pick adds each eligible
// upstream's weight to its current value, takes the largest and subtracts
// the round's total weight from it. Over any run of total-weight picks each
// upstream gets exactly its weight, spread out rather than in bursts.
type weighted struct {
	mu      sync.Mutex
	current []int64
}

func (w *weighted) Pick(ups []*Upstream, c Choice) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	best := -1
	var total int64
	for m := c.Eligible; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		wt := int64(ups[i].Spec.Weight)
		w.current[i] += wt
		total += wt
		if best < 0 || w.current[i] > w.current[best] {
			best = i
		}
	}
	if best >= 0 {
		w.current[best] -= total
	}
	return best
}

// affinity is weighted rendezvous (highest random weight) hashing: each
// upstream scores the session key and the highest score wins. Losing an
// upstream moves only the sessions it won; nothing has to be rebuilt when
// health changes, and the cost is one hash per upstream.
type affinity struct {
	balance float64
}

func (a affinity) Pick(ups []*Upstream, c Choice) int {
	if c.Key == "" {
		return pickLeastLoaded(ups, c.Eligible)
	}
	kh := fnv64(c.Key)
	best := -1
	bestScore := math.Inf(-1)
	for m := c.Eligible; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		if s := hrwScore(kh, ups[i]); s > bestScore {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return -1
	}
	least := pickLeastLoaded(ups, c.Eligible)
	chosen, low := float64(ups[best].Load()), float64(ups[least].Load())
	if chosen > a.balance*low && chosen-low >= affinityMinGap {
		return least
	}
	return best
}

// hrwScore is the weighted rendezvous score -weight/ln(u) of u, a uniform
// (0,1) number derived from the key and the upstream's name. The hash is
// the same in every process, so every api sends a session to one place.
func hrwScore(keyHash uint64, u *Upstream) float64 {
	h := mix64(keyHash ^ u.nameHash)
	x := (float64(h>>11) + 0.5) / (1 << 53)
	return -float64(u.Spec.Weight) / math.Log(x)
}

// fnv64 is FNV-1a over s, written out so hashing a key allocates nothing.
func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is the splitmix64 finaliser: FNV alone leaves the high bits of
// similar inputs correlated.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// latency is power of two choices: of two eligible upstreams drawn at
// random, the one with the lower peak-EWMA first-chunk latency × (load+1).
// Drawing two rather than scanning for the best keeps every api process
// from herding onto the same momentarily fastest replica.
type latency struct{}

func (latency) Pick(ups []*Upstream, c Choice) int {
	n := bits.OnesCount64(c.Eligible)
	switch n {
	case 0:
		return -1
	case 1:
		return bits.TrailingZeros64(c.Eligible)
	}
	a := rand.IntN(n)
	b := rand.IntN(n - 1)
	if b >= a {
		b++
	}
	i, j := nthBit(c.Eligible, a), nthBit(c.Eligible, b)
	si, sj := ups[i].latencyScore(), ups[j].latencyScore()
	if sj < si || (sj == si && ups[j].Load() < ups[i].Load()) {
		return j
	}
	return i
}

// nthBit returns the index of the n-th (from 0) set bit of m.
func nthBit(m uint64, n int) int {
	for ; n > 0; n-- {
		m &= m - 1
	}
	return bits.TrailingZeros64(m)
}
