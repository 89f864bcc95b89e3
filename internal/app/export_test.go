package app

// idleConns returns how many connections Serve's limiter counts idle:
// the ones it may close to make room at MAX_CONNECTIONS.
func (a *API) idleConns() int {
	l := a.conns.Load()
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}
