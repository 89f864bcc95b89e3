package worker

// FenceAfter exposes fenceAfter to the package's external tests.
var FenceAfter = fenceAfter

// Running returns how many jobs the worker is answering now.
func (w *Worker) Running() int { return w.cancels.running() }

func (c *cancelWatch) running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.jobs)
}

// parked returns how many jobs wait for their turn.
func (s *scheduler) parked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.urgent)
	for _, q := range s.queues {
		n += len(q)
	}
	return n
}
