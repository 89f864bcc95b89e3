package connwatch

import "testing"

// On Linux a connection with a descriptor is watched by the poller, not
// by a goroutine of its own, and the poller forgets it at Stop or at its
// hang-up.
func TestLinuxUsesThePoller(t *testing.T) {
	server, client := pair(t)
	s2, _ := pair(t)
	before := watched()
	w := Start(server)
	w2 := Start(wrapped{s2})
	if got := watched(); got != before+2 {
		t.Fatalf("poller watches %d, want %d: a watch fell back to a read", got, before+2)
	}
	w2.Stop()
	client.Close()
	waitGone(t, w)
	if got := watched(); got != before {
		t.Fatalf("poller still watches %d, want %d", got, before)
	}
	w.Stop()
}

func watched() int {
	p := getPoller()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watches.Len()
}
