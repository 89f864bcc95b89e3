package admission

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
)

// Sources feeds a Degrader from state kept elsewhere, without I/O: the
// overflow gate's cached backlog (cluster-wide), Recent's last minute of
// queue waits and ended requests (cluster-wide), and this process's heap
// against GOMEMLIMIT. A nil part reads as zero.
type Sources struct {
	Overflow *Overflow
	Recent   *Recent
	// Heap returns the heap fraction; nil means HeapFraction.
	Heap func() float64
}

var _ DegradeInputs = Sources{}

// Signals reads every source once.
func (s Sources) Signals() DegradeSignals {
	var out DegradeSignals
	if s.Overflow != nil {
		out.BacklogFraction = float64(s.Overflow.Depth()) / float64(s.Overflow.Threshold())
	}
	if s.Recent != nil {
		out.QueueWaitP99 = s.Recent.QueueWaitP99()
		out.ErrorRate = s.Recent.ErrorRate()
		out.Requests = s.Recent.Requests()
		out.LatestErrorRate = s.Recent.LatestErrorRate()
	}
	if s.Heap != nil {
		out.HeapFraction = s.Heap()
	} else {
		out.HeapFraction = HeapFraction()
	}
	return out
}

// heapSamples are the runtime metrics HeapFraction reads: the memory the
// Go runtime holds, less the heap it returned to the OS, is what the
// garbage collector measures against GOMEMLIMIT.
var heapSamples = []string{"/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}

// HeapFraction returns the memory the Go runtime counts against its soft
// limit (GOMEMLIMIT, or debug.SetMemoryLimit) over that limit; 0 when no
// limit is set.
func HeapFraction() float64 {
	limit := debug.SetMemoryLimit(-1)
	if limit <= 0 || limit == math.MaxInt64 {
		return 0
	}
	s := make([]metrics.Sample, len(heapSamples))
	for i, name := range heapSamples {
		s[i].Name = name
	}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	used := s[0].Value.Uint64() - min(s[1].Value.Uint64(), s[0].Value.Uint64())
	return float64(used) / float64(limit)
}
