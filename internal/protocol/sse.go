package protocol

import "strconv"

// SSE event names. A chunk has no event name (EventSource onmessage).
const (
	EventDone  = "done"
	EventError = "error"
	EventReset = "reset"
	// EventQueued says where a waiting request stands (Queued).
	EventQueued = "queued"
	// EventRetrying: a worker waits out a backoff (Retrying).
	EventRetrying = "retrying"
)

// PingFrame is the SSE heartbeat comment.
var PingFrame = []byte(": ping\n\n")

// Queued is the data of a `queued` event: the jobs waiting ahead of this
// one and the expected wait, absent until a drain rate was observed
// (docs/API.md, "queued").
type Queued struct {
	Position   int64  `json:"position"`
	EtaSeconds *int64 `json:"eta_seconds,omitempty"`
}

// AppendIDEvent appends an event with id and name (empty for a chunk)
// whose data is already-encoded JSON, as the stream log stores it.
func AppendIDEvent(dst []byte, id int64, name string, data []byte) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendInt(dst, id, 10)
	dst = append(dst, '\n')
	if name != "" {
		dst = append(append(append(dst, "event: "...), name...), '\n')
	}
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}
