package admin

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/adminhook"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// The browser tests (e2e module) draw past charts through adminhook.SampleAt.
func init() {
	adminhook.SampleAt = func(ctx context.Context, h any, at time.Time) error { return h.(*Handler).sampleAt(ctx, at) }
}

// Sample reads the inbox backlog and every relay's backlog and lag (outbox.Stats) once and
// adds them to the history the charts show. The background
// sampler calls it every Config.SampleInterval; call it yourself to sample on your own
// schedule (with a negative SampleInterval). Parts that cannot be read are left out of the
// sample and their errors returned; the rest is kept.
func (h *Handler) Sample(ctx context.Context) error {
	return h.sampleAt(ctx, time.Now())
}

func (h *Handler) sampleAt(ctx context.Context, at time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, h.config.QueryTimeout)
	defer cancel()
	s := sample{at: at}
	var errs []error
	if stats, err := h.ops.AllStats(ctx); err != nil {
		errs = append(errs, err)
	} else {
		s.inbox = make(map[string]inboxSample, len(stats))
		for c, st := range stats {
			s.inbox[c] = inboxSample{pending: st.Pending, failed: st.Failed, oldestAge: st.OldestPendingAge.Seconds()}
		}
	}
	if relays, _, err := outbox.Stats(ctx, h.db, h.config.Schema); err != nil {
		errs = append(errs, err)
	} else {
		s.relays = make(map[string]relaySample, len(relays))
		for _, r := range relays {
			s.relays[r.Name] = relaySample{backlog: r.Backlog, lag: r.Lag.Seconds()}
		}
	}
	h.history.add(s)
	return errors.Join(errs...)
}

func (h *Handler) sampleLoop(ctx context.Context) {
	defer close(h.stopped)
	t := time.NewTicker(h.config.SampleInterval)
	defer t.Stop()
	for {
		h.sampleAndLog(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleAndLog takes a sample and logs its failure once, not every interval (an unmigrated
// schema would fill the log); a failure that changes is logged again. Missing tables are the
// operator's to fix, as the API's 503 says, so they are logged at info level.
func (h *Handler) sampleAndLog(ctx context.Context) {
	err := h.Sample(ctx)
	if ctx.Err() != nil {
		return
	}
	msg := errText(err)
	switch {
	case !h.history.errorChanged(msg) || err == nil:
	case pgtx.IsUndefinedTable(err):
		h.logger.Info("Admin history samples nothing: the schema lacks watermill-once tables (logged again when this changes)", watermill.LogFields{
			"schema": h.config.Schema, "error": msg, "fix": h.missingTableFix(ctx)})
	default:
		h.logger.Error("Admin history sample failed (logged again when the error changes)", err, nil)
	}
}

// errText is err's text, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
