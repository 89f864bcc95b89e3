package stream

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/internal/llm"
	"github.com/spillway-dev/spillway/internal/pool"
	"github.com/spillway-dev/spillway/internal/protocol"
)

// direct streams from the provider in this process while holding lease
// (docs/ARCHITECTURE.md, "Direct path").
func (h *Handler) direct(w http.ResponseWriter, r *http.Request, req protocol.ChatRequest, requestID string, lease pool.Lease, start time.Time) {
	defer lease.Release()
	ctx, cancel := context.WithCancel(r.Context())
	frames := make(chan protocol.Result, h.cfg.FrameBuffer)
	var producer sync.WaitGroup
	producer.Go(func() { h.produceDirect(ctx, req, requestID, frames) })

	began := time.Now()
	s := &session{h: h, w: w, requestID: requestID, path: protocol.PathDirect, start: start, frames: frames}
	outcome, _ := s.serve(ctx)
	held := time.Since(began)
	// The provider call ends before the lease is released.
	cancel()
	producer.Wait()
	if outcome == OutcomeDone {
		h.gate.ServiceDone(held)
	}
}

// produceDirect calls the provider and hands each chunk, then a terminal
// done or error, to the write loop over frames.
func (h *Handler) produceDirect(ctx context.Context, req protocol.ChatRequest, requestID string, frames chan<- protocol.Result) {
	seq := 0
	send := func(res protocol.Result) error {
		select {
		case frames <- res:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	result, err := h.provider.Stream(ctx, req, func(content string) error {
		seq++
		return send(protocol.Result{Kind: protocol.KindBatch, Chunks: []protocol.Chunk{{Seq: seq, Content: content}}})
	})
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("provider failed", "request_id", requestID, "path", protocol.PathDirect, "chunks", seq, "err", err)
		}
		// No retry delay unless the provider advised one: the direct path
		// has no backoff of its own.
		p := protocol.ProviderFailed(0)
		var le *llm.Error
		switch {
		case llm.IsClientError(err):
			// The upstream refused this request's content (400, 404, 422):
			// the client's fault, and a retry as is cannot succeed.
			p = protocol.ClientRequestRejected()
		case errors.As(err, &le) && le.Retryable:
			p.RetryAfterSeconds = max(1, int(le.RetryAfter/time.Second))
		}
		_ = send(protocol.Result{Kind: protocol.KindError, Problem: p})
		return
	}
	usage := result.Usage
	_ = send(protocol.Result{Kind: protocol.KindDone, Done: &protocol.Done{
		RequestID: requestID, FinishReason: result.FinishReason, Path: protocol.PathDirect, Usage: &usage,
	}})
}
