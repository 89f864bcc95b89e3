package llm_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// scripted fails its calls with errs in order, then succeeds.
type scripted struct {
	errs []error
	n    int
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Stream(context.Context, protocol.ChatRequest, func(string) error) (llm.Result, error) {
	s.n++
	if s.n <= len(s.errs) {
		return llm.Result{}, s.errs[s.n-1]
	}
	return llm.Result{FinishReason: "stop"}, nil
}

func TestCountResponsesCountsOncePerCallWithAResponse(t *testing.T) {
	t.Parallel()
	inner := &scripted{errs: []error{
		&llm.Error{Retryable: true, Status: http.StatusTooManyRequests},
		&llm.Error{Retryable: true, Err: errors.New("connection refused")}, // no response
		&llm.Error{Status: http.StatusNotFound},
		&llm.Error{Retryable: true, Status: http.StatusOK, Err: llm.ErrIdleTimeout}, // inside a 200 stream
		context.Canceled,
	}}
	var codes []string
	p := llm.CountResponses(inner, func(code string) { codes = append(codes, code) })
	if p.Name() != "scripted" {
		t.Errorf("Name %q, want the wrapped provider's", p.Name())
	}
	for range 6 {
		_, _ = p.Stream(context.Background(), protocol.ChatRequest{}, func(string) error { return nil })
	}
	if want := []string{"429", "404", "200", "200"}; !slices.Equal(codes, want) {
		t.Errorf("counted codes %q, want %q", codes, want)
	}
}
