package admin

import (
	"context"
	"time"
)

// SampleAt takes a sample as if at time at, so a test can draw a history without waiting.
func SampleAt(ctx context.Context, h *Handler, at time.Time) error { return h.sampleAt(ctx, at) }

// SampleAndLog is one round of the background sampler: a sample, and its failure logged.
func SampleAndLog(ctx context.Context, h *Handler) { h.sampleAndLog(ctx) }
