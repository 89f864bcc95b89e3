package upstream

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// probeLoop probes every upstream each ProbeEvery, in the one process that
// takes the round's lock (when Health can lock; LocalHealth always can).
func (b *Balancer) probeLoop(ctx context.Context) {
	defer b.done.Done()
	t := time.NewTicker(b.cfg.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if l, ok := b.health.(ProbeLocker); ok && !l.TryProbeLock(ctx, b.cfg.ProbeEvery) {
			continue
		}
		b.ProbeAll(ctx)
	}
}

// ProbeAll probes each upstream once, as one round of the active probe:
// an upstream awaiting its trial is tried by the probe when this process
// wins the claim (2xx brings it back, a failure sits it out again); a
// healthy one that fails counts a failure toward ejection; one sitting out
// is left alone. It returns when every probe has ended.
func (b *Balancer) ProbeAll(ctx context.Context) {
	for i, u := range b.ups {
		switch b.health.State(i) {
		case Ejected:
			continue
		case Trial:
			if !b.health.ClaimTrial(ctx, i) {
				continue
			}
			if err := b.probe(ctx, u); err != nil {
				b.recordFailure(ctx, u, Failure{Trial: true, Reason: "probe: " + err.Error()})
				continue
			}
			back, err := b.health.Succeeded(ctx, i)
			if err != nil {
				b.log.Warn("upstream: recording a success failed", "upstream", u.Spec.Name, "error", err)
			}
			if back {
				b.log.Info("upstream: returned", "upstream", u.Spec.Name, "reason", "probe answered 2xx")
				b.showHealth(u, Healthy)
			}
		case Healthy:
			// A healthy answer is not a success: a replica may list its
			// models while failing every completion.
			if err := b.probe(ctx, u); err != nil && ctx.Err() == nil {
				b.recordFailure(ctx, u, Failure{Reason: "probe: " + err.Error()})
			}
		}
	}
}

// probe sends GET {base_url}/models and wants a 2xx.
func (b *Balancer) probe(ctx context.Context, u *Upstream) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(u.Spec.BaseURL, "/")+"/models", nil)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	if u.Spec.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+u.Spec.APIKey)
	}
	resp, err := b.prober.Do(req)
	if err != nil {
		return fmt.Errorf("GET /models: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET /models: status %d", resp.StatusCode)
	}
	return nil
}
