package app

import "testing"

// A parked stream (its handler returned while it waits, stream.Deps.Hold)
// keeps the drain from finding the api idle until it ends, as its request
// did; its release counts once however often it is called.
func TestDrainerCountsParkedStreams(t *testing.T) {
	t.Parallel()
	d := newDrainer()
	release := d.hold()
	if !d.enter() {
		t.Fatal("a request was refused before the drain")
	}
	d.leave() // the parked stream's request returns
	idle := d.begin()
	select {
	case <-idle:
		t.Fatal("the drain found the api idle with a parked stream open")
	default:
	}
	release()
	release()
	select {
	case <-idle:
	default:
		t.Fatal("the drain did not end once the parked stream ended")
	}
	if d.open != 0 {
		t.Fatalf("%d open after the stream ended, want 0", d.open)
	}
}
