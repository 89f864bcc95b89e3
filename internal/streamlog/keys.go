// Package streamlog owns the per-request stream log (docs/API.md, "Resume
// and stop"): a short-lived Redis stream of the events a request's client
// was sent, written off the hot path by a batching Appender, read back by
// a Reader to replay and tail a stream on any api process.
package streamlog

// Key is a request's log: <prefix>log:{<request_id>}. The hash tag puts
// it and ReaderKey on one Redis Cluster slot.
func Key(prefix, requestID string) string {
	return prefix + "log:{" + requestID + "}"
}

// ReaderKey is set, with a short TTL refreshed while someone reads the
// log on a resume, so the producer of a stream whose first client left
// knows the answer is still wanted: <prefix>log:{<request_id>}:reader.
func ReaderKey(prefix, requestID string) string {
	return prefix + "log:{" + requestID + "}:reader"
}

// compactKey is where a finished log is copied before the copy is renamed
// back (Appender.compact): <prefix>log:{<request_id>}:compact, on the
// log's slot. It exists only between the two commands.
func compactKey(prefix, requestID string) string {
	return prefix + "log:{" + requestID + "}:compact"
}

// ProducerKey is the liveness marker of the process that writes logs as
// producer (Config.Producer): set with a TTL of Config.Liveness and
// refreshed well within it while the process runs, so a resume of a log
// whose producer died ends once the marker expired instead of waiting for
// the log's TTL: <prefix>log:producer:<producer>.
func ProducerKey(prefix, producer string) string {
	return prefix + "log:producer:" + producer
}
