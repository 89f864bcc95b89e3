package redispool

// idleLen returns how many leases are idle (tests).
func (p *Pool) idleLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idleCount
}
