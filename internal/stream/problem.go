package stream

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// Problems the api writes on purpose. Their detail is client text.
var (
	problemPoolFull = protocol.NewProblem(protocol.ProblemPoolExhausted, "Capacity Exhausted",
		http.StatusServiceUnavailable, "No streaming slot is free for this request; retry shortly.")
	problemShuttingDown = protocol.NewProblem(protocol.ProblemShuttingDown, "Shutting Down",
		http.StatusServiceUnavailable, "The server is restarting; retry the request.")
	problemInternal = protocol.NewProblem(protocol.ProblemInternal, "Internal Error",
		http.StatusInternalServerError, "The stream failed unexpectedly; retry the request.")
)

// WriteProblem answers with p as application/problem+json, adding
// Retry-After when p advises a retry. instance identifies the occurrence.
func WriteProblem(w http.ResponseWriter, p *protocol.Problem, instance string) {
	c := *p
	if c.Instance == "" {
		c.Instance = instance
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if c.RetryAfterSeconds > 0 {
		h.Set("Retry-After", strconv.Itoa(c.RetryAfterSeconds))
	}
	b, _ := json.Marshal(&c) // a struct of strings and ints cannot fail
	w.WriteHeader(c.Status)
	_, _ = w.Write(append(b, '\n'))
}
