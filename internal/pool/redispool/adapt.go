package redispool

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/internal/llm/adaptive"
)

// limitKeep is how long an adaptive limit outlives its last report: long
// enough to survive a restart of every process, short enough that a limit
// nobody reports on any more (ADAPTIVE_CONCURRENCY turned off) goes away.
const limitKeep = time.Hour

var _ adaptive.Store = (*Pool)(nil)

// Report applies one process's report to the adaptive limit called name
// (adapt.lua, LimitKey), shared by every process on this Redis, and
// returns the limit after it. A limit that grew wakes the waiters of
// every process. When name is the Pool's own AdaptiveLimit, Stats reports
// the limit at once. Errors wrap the Redis failure; the caller keeps its
// last limit. Report does not switch the Pool to its fallback: the next
// acquire finds out.
func (p *Pool) Report(ctx context.Context, name string, r adaptive.Report, params adaptive.Params) (int, error) {
	if err := params.Validate(); err != nil {
		return 0, err
	}
	if name == "" || strings.ContainsAny(name, "{}") {
		return 0, fmt.Errorf("redispool: adaptive limit name %q is empty or contains a brace", name)
	}
	throttle := "0"
	if r.Throttle {
		throttle = "1"
	}
	key := LimitKey(p.cfg.Prefix, name)
	v, err := adaptScript.Run(ctx, p.rdb, []string{key}, params.Floor, params.Ceiling, params.Interval.Milliseconds(),
		r.Calls, throttle, p.channel, limitKeep.Milliseconds(), p.reclaim).Int()
	if err != nil {
		return 0, fmt.Errorf("redispool: adaptive limit %s: %w", key, err)
	}
	if key == p.limitKey {
		p.statsMu.Lock()
		fell := v < p.limit
		p.statsMu.Unlock()
		p.setLimit(v)
		if fell {
			// Every process is told on ReclaimChannel; this one gives its
			// idle leases back without waiting for the message.
			p.requestFlush("")
		}
	}
	return v, nil
}
