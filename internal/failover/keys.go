package failover

// Key and channel names, one builder per name. prefix is QUEUE_PREFIX
// (default "queue:"); the names are the contract in docs/QUEUE.md, "Keys".
//
// Per-request names carry the request id as a Redis Cluster hash tag
// ("{<request_id>}"): on a cluster every key and channel of one request
// hashes to the same slot, so they live on one primary, a multi-key
// command over them is legal, and the sharded Pub/Sub channel is served
// by the node that also holds the request's keys (docs/OPERATIONS.md,
// "Redis Cluster and Sentinel"). On one Redis the braces are just
// characters of the name.

// ResultChannel is the Pub/Sub channel a request's results travel on:
// queue:results:{<request_id>}. On a cluster it is a sharded channel
// (SSUBSCRIBE/SPUBLISH).
func ResultChannel(prefix, requestID string) string {
	return prefix + "results:{" + requestID + "}"
}

// CancelKey marks a request whose client gave up, so no worker starts it:
// queue:cancel:{<request_id>}.
func CancelKey(prefix, requestID string) string {
	return prefix + "cancel:{" + requestID + "}"
}

// CancelChannel is where the api announces a client that left, so the
// worker running its job cancels the provider call at once. It is one
// channel for all requests (every worker listens to it), so it is not
// per-request and carries no hash tag; on a cluster it stays a classic
// channel, which Redis broadcasts to every node.
func CancelChannel(prefix string) string {
	return prefix + "cancel"
}
