package stream

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/spillway-dev/spillway/internal/protocol"
)

// WriteProblem answers with p as application/problem+json, adding
// Retry-After when p advises a retry. instance identifies the occurrence.
// The problems themselves come from protocol's catalogue.
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
