package protocol

import (
	"fmt"
	"time"
)

// Priority is how urgently a request wants a provider slot (docs/API.md,
// "Priority"): it decides who is shed first as the backlog grows. The
// zero value is read as PriorityNormal, so jobs written before the field
// existed keep their meaning.
type Priority string

// The priorities a client may ask for with X-Priority, lowest first.
const (
	PriorityLow    Priority = "low"
	PriorityNormal Priority = "normal"
	PriorityHigh   Priority = "high"
)

// Priorities lists every priority, lowest first, for metrics that
// pre-create one series per value.
var Priorities = []Priority{PriorityLow, PriorityNormal, PriorityHigh}

// ParsePriority reads an X-Priority value or a PRIORITY_MAX setting: one
// of high, normal, low (exact, lower case). Anything else is an error
// written for the client.
func ParsePriority(s string) (Priority, error) {
	switch p := Priority(s); p {
	case PriorityLow, PriorityNormal, PriorityHigh:
		return p, nil
	}
	return "", fmt.Errorf("priority %.32q is not one of high, normal, low", s)
}

// Rank orders priorities: low 0, normal 1, high 2; the zero value ranks
// as normal.
func (p Priority) Rank() int {
	switch p {
	case PriorityLow:
		return 0
	case PriorityHigh:
		return 2
	}
	return 1
}

// OrNormal returns p, or PriorityNormal for the zero value.
func (p Priority) OrNormal() Priority {
	if p == "" {
		return PriorityNormal
	}
	return p
}

// AtMost returns p lowered to ceiling when it ranks above it: a caller
// asking for more than it may is served at its maximum, not refused.
func (p Priority) AtMost(ceiling Priority) Priority {
	if p.Rank() > ceiling.Rank() {
		return ceiling.OrNormal()
	}
	return p.OrNormal()
}

// DefaultPriorityAging is PRIORITY_AGING_SECONDS' default: how long a
// waiting job takes to count one priority level higher, in the queue's
// order and in a worker's wait for a pool slot alike.
const DefaultPriorityAging = 30 * time.Second

// PlaceInLine is where a job of priority p enqueued at enqueued stands in
// the line of waiting jobs (docs/QUEUE.md, "Priority order"): its enqueue
// time, moved aging earlier for high and aging later for low. Jobs start
// in order of place, so a higher priority goes first, FIFO holds within
// one, and a job counts one level higher for every aging it has waited.
func PlaceInLine(enqueued time.Time, p Priority, aging time.Duration) time.Time {
	return enqueued.Add(time.Duration(1-p.Rank()) * aging)
}
