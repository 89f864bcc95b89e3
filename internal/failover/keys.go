package failover

// Key and channel names, one builder per name. prefix is QUEUE_PREFIX
// (default "queue:"); the names are the contract in docs/QUEUE.md, "Keys".

// ResultChannel is the Pub/Sub channel a request's results travel on:
// queue:results:<request_id>.
func ResultChannel(prefix, requestID string) string {
	return prefix + "results:" + requestID
}

// CancelKey marks a request whose client gave up, so no worker starts it:
// queue:cancel:<request_id>.
func CancelKey(prefix, requestID string) string {
	return prefix + "cancel:" + requestID
}

// CancelChannel is where the api announces a client that left, so the
// worker running its job cancels the provider call at once.
func CancelChannel(prefix string) string {
	return prefix + "cancel"
}
