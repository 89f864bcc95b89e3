package protocol

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

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

// ErrFieldInjection is returned when an SSE event name or id holds CR, LF or
// NUL, which would let the value start a field of its own (CWE-93).
var ErrFieldInjection = errors.New("protocol: CR, LF or NUL in an SSE field")

// PingFrame is the SSE heartbeat comment.
var PingFrame = []byte(": ping\n\n")

type chunkData struct {
	Content string `json:"content"`
}

// AppendEvent appends one SSE event to dst. name and id may be empty; data
// is split on line breaks into several `data:` lines so no byte of it can
// start another field.
func AppendEvent(dst []byte, name, id, data string) ([]byte, error) {
	if strings.ContainsAny(name, "\r\n\x00") || strings.ContainsAny(id, "\r\n\x00") {
		return dst, ErrFieldInjection
	}
	if id != "" {
		dst = append(append(append(dst, "id: "...), id...), '\n')
	}
	if name != "" {
		dst = append(append(append(dst, "event: "...), name...), '\n')
	}
	data = strings.ReplaceAll(data, "\x00", "\uFFFD")
	data = strings.ReplaceAll(data, "\r\n", "\n")
	data = strings.ReplaceAll(data, "\r", "\n")
	for {
		line, rest, found := strings.Cut(data, "\n")
		dst = append(append(append(dst, "data: "...), line...), '\n')
		if !found {
			break
		}
		data = rest
	}
	return append(dst, '\n'), nil
}

// AppendChunkEvent appends a chunk event: `id: <seq>` and the content as
// JSON. JSON escapes line breaks and NUL, so content cannot inject fields.
func AppendChunkEvent(dst []byte, seq int, content string) []byte {
	b, _ := json.Marshal(chunkData{Content: content}) // a struct of one string cannot fail
	dst = append(dst, "id: "...)
	dst = strconv.AppendInt(dst, int64(seq), 10)
	dst = append(dst, "\ndata: "...)
	dst = append(dst, b...)
	return append(dst, "\n\n"...)
}

// AppendJSONEvent appends a named event whose data is v as JSON.
func AppendJSONEvent(dst []byte, name string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, err
	}
	return AppendEvent(dst, name, "", string(b))
}

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
