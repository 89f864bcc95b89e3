package admission

import "context"

// Test-only helpers over the package's state.

// levelOf is the highest level the inputs that act at once reach; the
// failure rate is not one of them (Degrader.errorLevel).
func levelOf(s DegradeSignals) int {
	lvl := 0
	for _, l := range inputLevels(s) {
		lvl = max(lvl, l)
	}
	return lvl
}

// DepthFunc adapts a function to a Backlog.
type DepthFunc func(ctx context.Context) (int64, error)

// Depth calls f.
func (f DepthFunc) Depth(ctx context.Context) (int64, error) { return f(ctx) }

func (g *localGCRA) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lru.Len()
}
