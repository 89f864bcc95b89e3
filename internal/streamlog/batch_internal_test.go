package streamlog

import (
	"slices"
	"testing"
)

// Any input: no panic; what decodes encodes back to an entry that decodes
// to the same events, and every event is one a batch line can carry.
func FuzzDecodeBatch(f *testing.F) {
	f.Add("1  {}\n2 done {\"usage\":{}}")
	f.Add("7 retrying {\"attempt\":2}")
	f.Add("1  a b c\n3  x")
	f.Add("")
	f.Add("1  {}\n1  {}")
	f.Add("1\r  {}")
	f.Fuzz(func(t *testing.T, b string) {
		evs, err := decodeBatch(b, nil)
		if err != nil {
			if len(evs) != 0 {
				t.Fatalf("malformed entry added %d events", len(evs))
			}
			return
		}
		for _, ev := range evs {
			if !batchable(ev) {
				t.Fatalf("decoded %+v, which a batch line cannot carry", ev)
			}
		}
		again, err := decodeBatch(string(appendBatch(nil, evs)), nil)
		if err != nil || !slices.EqualFunc(evs, again, func(a, b Event) bool {
			return a.ID == b.ID && a.Name == b.Name && string(a.Data) == string(b.Data)
		}) {
			t.Fatalf("round trip of %q: %+v, %v", b, again, err)
		}
	})
}
