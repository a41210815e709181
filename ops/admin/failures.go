package admin

import (
	"context"
	"errors"
	"math"
	"net/http"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/operate"
)

// GET /api/failures[?max_rows=N] (N: 0 for every row; default DefaultFailureGroupRows)
func (h *Handler) failureGroups(ctx context.Context, r *http.Request) (any, error) {
	maxRows, err := queryInt(r.URL.Query(), "max_rows", operate.DefaultFailureGroupRows, 0, math.MaxInt32, "a non-negative integer (0: every row)")
	if err != nil {
		return nil, err
	}
	return operate.ReadFailureGroups(ctx, h.db, h.config.Schema, int(maxRows))
}

// POST /api/failures/act
func (h *Handler) failureAct(ctx context.Context, r *http.Request) (any, error) {
	var req operate.FailureActionRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	out, err := operate.ActOnFailureGroup(ctx, h.db, h.config.Schema, req)
	if errors.Is(err, operate.ErrNoFailureGroup) {
		return nil, &apiError{status: http.StatusNotFound, msg: err.Error()}
	}
	if err != nil {
		return nil, err
	}
	if !req.DryRun {
		h.logger.Info("Failure group changed from the admin page", watermill.LogFields{
			"kind": req.Kind, "fingerprint": req.Fingerprint, "action": req.Action, "rows": out.Rows, "ids": out.IDs, "remote": r.RemoteAddr,
		})
	}
	return out, nil
}
