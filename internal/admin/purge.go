package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/spillway-dev/spillway/internal/failover"
)

// purge deletes the dead letters named, or all of them.
func (t *Tool) purge(ctx context.Context, args []string) int {
	fs := t.flags("purge")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	all := fs.Bool("all", false, "delete every dead letter")
	ids, ok := parse(fs, args)
	if !ok {
		return ExitUsage
	}
	switch {
	case *all && len(ids) > 0:
		return t.failf(ExitUsage, "purge takes -all or dead-letter ids, not both")
	case !*all && len(ids) == 0:
		return t.failf(ExitUsage, "purge needs dead-letter ids, or -all")
	}
	if *all {
		return t.purgeAll(ctx, *yes)
	}
	del, ok := t.deps.Store.(Deleter)
	if !ok {
		return t.failf(ExitUsage, "the %s dead-letter queue cannot delete single records; purge -all deletes them all", t.cfg.Backend)
	}
	// Every id must name a record, or nothing is deleted: a typo must not
	// pass for a purge.
	for _, id := range ids {
		if _, err := t.deps.Store.DeadLetterByID(ctx, id); errors.Is(err, failover.ErrDeadLetterNotFound) {
			return t.failf(ExitNotFound, "no dead letter %q; nothing purged", id)
		} else if err != nil {
			return t.backendErr("read dead letter "+id, err)
		}
	}
	if !*yes && !t.confirm(fmt.Sprintf("Delete %d dead letters for good?", len(ids))) {
		return t.failf(ExitAborted, "not confirmed; nothing purged")
	}
	n, err := del.DeleteDeadLetters(ctx, ids...)
	if err != nil {
		return t.backendErr("delete dead letters", err)
	}
	fmt.Fprintf(t.deps.Stderr, "purged %d dead letters\n", n)
	return ExitOK
}

func (t *Tool) purgeAll(ctx context.Context, yes bool) int {
	depth, err := t.deps.Store.DeadLetterDepth(ctx)
	if err != nil {
		return t.backendErr("count dead letters", err)
	}
	if !yes && !t.confirm(fmt.Sprintf("Delete all %d dead letters (%s) for good?", depth, t.cfg.Backend)) {
		return t.failf(ExitAborted, "not confirmed; nothing purged")
	}
	n, err := t.deps.Store.PurgeDeadLetters(ctx)
	if err != nil {
		return t.backendErr("purge dead letters", err)
	}
	fmt.Fprintf(t.deps.Stderr, "purged %d dead letters\n", n)
	return ExitOK
}
