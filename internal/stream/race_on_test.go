//go:build race

package stream_test

// raceEnabled: the race detector makes sync.Pool drop a quarter of what is
// put in it, so pooled buffers are allocated again now and then.
const raceEnabled = true
