package shrinkmap

import (
	"runtime"
	"strconv"
	"testing"
)

// A map that held many entries gives its room back when most are gone,
// and keeps every entry it still has.
func TestShrinksAfterBurst(t *testing.T) {
	var m Map[string, int]
	const n = 10_000
	for i := range n {
		m.Set(strconv.Itoa(i), i)
	}
	if m.Peak() != n {
		t.Fatalf("peak %d, want %d", m.Peak(), n)
	}
	for i := range n - 10 {
		m.Delete(strconv.Itoa(i))
	}
	if m.Len() != 10 {
		t.Fatalf("len %d, want 10", m.Len())
	}
	if m.Peak() >= MinPeak {
		t.Fatalf("peak %d after falling to 10 entries: the map was not made anew", m.Peak())
	}
	for i := n - 10; i < n; i++ {
		if v, ok := m.Get(strconv.Itoa(i)); !ok || v != i {
			t.Fatalf("entry %d: %d, %v", i, v, ok)
		}
	}
}

// A map that never reached MinPeak is left as it is.
func TestSmallMapNotCopied(t *testing.T) {
	var m Map[int, int]
	for i := range MinPeak - 1 {
		m.Set(i, i)
	}
	for i := range MinPeak - 2 {
		m.Delete(i)
	}
	if m.Peak() != MinPeak-1 {
		t.Fatalf("peak %d, want %d: a small map was made anew", m.Peak(), MinPeak-1)
	}
}

// The memory: 100,000 entries set and deleted leave (almost) nothing
// live, where a plain map keeps its room.
func TestMemoryGivenBack(t *testing.T) {
	live := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	const n = 100_000
	base := live()
	plain := make(map[int]int)
	for i := range n {
		plain[i] = i
	}
	for i := range n {
		delete(plain, i)
	}
	plainKept := int64(live()) - int64(base)
	runtime.KeepAlive(plain)
	plain = nil
	base = live()
	var m Map[int, int]
	for i := range n {
		m.Set(i, i)
	}
	for i := range n {
		m.Delete(i)
	}
	kept := int64(live()) - int64(base)
	runtime.KeepAlive(&m)
	if plainKept < 1<<20 {
		t.Fatalf("a plain map kept only %d bytes: the test measures nothing", plainKept)
	}
	if kept > plainKept/20 {
		t.Fatalf("the map kept %d bytes after emptying (a plain map %d)", kept, plainKept)
	}
}

// Deleting the entry just yielded during All is safe, even when that
// makes the map anew: every entry is yielded once.
func TestDeleteDuringAll(t *testing.T) {
	var m Map[int, int]
	const n = 4 * MinPeak
	for i := range n {
		m.Set(i, i)
	}
	seen := make(map[int]bool, n)
	for k := range m.All() {
		if seen[k] {
			t.Fatalf("%d yielded twice", k)
		}
		seen[k] = true
		m.Delete(k)
	}
	if len(seen) != n || m.Len() != 0 {
		t.Fatalf("yielded %d of %d, %d left", len(seen), n, m.Len())
	}
}
