package streamlog

import (
	"bytes"
	"strconv"
	"strings"
)

// fieldBatch holds several events of one log in one entry, one a line:
// "<id> <event> <data>" (the event name may be empty; data runs to the
// end of the line). A flush writes each log's run of events as one such
// entry, so a busy stream costs Redis one XADD a flush, not one a chunk.
const fieldBatch = "b"

// maxBatchEvents bounds the events of one batch entry.
const maxBatchEvents = 512

// batchable reports whether ev fits a batch line: a positive id, a name
// without a space or line break, data without a line break. Anything else
// is written as an entry of its own (which the reader refuses as it did
// before batches, when the data could inject SSE fields).
func batchable(ev Event) bool {
	return ev.ID > 0 && len(ev.Data) > 0 &&
		!strings.ContainsAny(ev.Name, " \r\n\x00") &&
		bytes.IndexByte(ev.Data, '\n') < 0 && bytes.IndexByte(ev.Data, '\r') < 0
}

// appendBatch appends evs, each batchable, as batch lines to buf.
func appendBatch(buf []byte, evs []Event) []byte {
	for i, ev := range evs {
		if i > 0 {
			buf = append(buf, '\n')
		}
		buf = strconv.AppendInt(buf, ev.ID, 10)
		buf = append(buf, ' ')
		buf = append(buf, ev.Name...)
		buf = append(buf, ' ')
		buf = append(buf, ev.Data...)
	}
	return buf
}

// decodeBatch checks and splits a batch entry into out: every line an
// event with a positive id, ids rising, a name and data that cannot
// inject SSE fields. A malformed entry adds nothing to out.
func decodeBatch(b string, out []Event) ([]Event, error) {
	if b == "" {
		return out, ErrMalformed
	}
	n := len(out)
	var last int64
	for line := range strings.SplitSeq(b, "\n") {
		idS, rest, ok1 := strings.Cut(line, " ")
		name, data, ok2 := strings.Cut(rest, " ")
		id, err := strconv.ParseInt(idS, 10, 64)
		if !ok1 || !ok2 || err != nil || id <= last || data == "" ||
			strings.ContainsAny(name, "\r\x00") || strings.ContainsAny(data, "\r\x00") {
			return out[:n], ErrMalformed
		}
		last = id
		out = append(out, Event{ID: id, Name: name, Data: []byte(data)})
	}
	return out, nil
}
