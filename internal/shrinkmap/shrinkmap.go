// Package shrinkmap holds a map that gives its memory back once it has
// emptied out. A Go map never shrinks: one that held an entry per open
// stream during a burst of 10,000 keeps room for 10,000 after the burst,
// hundreds of KiB each (docs/OPERATIONS.md, "Memory after a burst").
// Map copies itself into a map of its size when it has fallen to a
// quarter of its peak; the copies cost O(1) per delete, amortised.
package shrinkmap

import "iter"

// MinPeak is the smallest peak worth shrinking from: below it a map's
// room costs a few KiB at most.
const MinPeak = 1024

// Map is a map from K to V that shrinks. The zero Map is empty and ready
// to use. It is not safe for concurrent use.
type Map[K comparable, V any] struct {
	m    map[K]V
	peak int // the most entries since the map was last made
}

// Get returns k's value, and whether k is in the map.
func (s *Map[K, V]) Get(k K) (V, bool) {
	v, ok := s.m[k]
	return v, ok
}

// Set sets k's value.
func (s *Map[K, V]) Set(k K, v V) {
	if s.m == nil {
		s.m = make(map[K]V)
	}
	s.m[k] = v
	s.peak = max(s.peak, len(s.m))
}

// Delete removes k, then makes the map anew when it has fallen to a
// quarter of its peak (and the peak was at least MinPeak).
func (s *Map[K, V]) Delete(k K) {
	delete(s.m, k)
	if s.peak >= MinPeak && len(s.m) <= s.peak/4 {
		m := make(map[K]V, len(s.m))
		for k, v := range s.m {
			m[k] = v
		}
		s.m, s.peak = m, len(m)
	}
}

// Len returns the number of entries.
func (s *Map[K, V]) Len() int { return len(s.m) }

// Peak returns the most entries the map held since it was last made
// anew: the room it has.
func (s *Map[K, V]) Peak() int { return s.peak }

// All yields every entry, in no order. The map must not be changed
// meanwhile, except by deleting the entry just yielded: the iteration
// goes on over the map as it was if that makes it anew.
func (s *Map[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for k, v := range s.m {
			if !yield(k, v) {
				return
			}
		}
	}
}

// Reset empties the map and gives its room back.
func (s *Map[K, V]) Reset() { s.m, s.peak = nil, 0 }
