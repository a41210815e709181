package inbox

import (
	"context"

	"github.com/wmonce/watermill-once/internal/inboxops"
)

// The operations only the CLI and the admin page call (see internal/inboxops).
func init() {
	inboxops.FailureGroups = func(ctx context.Context, ops any, maxRows int) ([]inboxops.FailureGroup, int64, error) {
		return ops.(*Ops).failureGroups(ctx, maxRows)
	}
	inboxops.ReplayGroup = func(ctx context.Context, ops any, req inboxops.GroupRequest) (inboxops.GroupResult, error) {
		return ops.(*Ops).replayGroup(ctx, req)
	}
	inboxops.SkipGroup = func(ctx context.Context, ops any, req inboxops.GroupRequest, reason string) (inboxops.GroupResult, error) {
		return ops.(*Ops).skipGroup(ctx, req, reason)
	}
	inboxops.CheckChange = func(op string, f any) error { return changeable(op, f.(Filter)) }
	inboxops.CountFinished = func(ctx context.Context, ops any) (map[string]inboxops.FinishedStats, error) {
		return ops.(*Ops).finishedStats(ctx)
	}
}
