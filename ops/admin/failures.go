package admin

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/operate"
)

// GET /api/failures[?max_rows=N] (N: 0 for every row; default DefaultFailureGroupRows)
func (h *Handler) failureGroups(ctx context.Context, r *http.Request) (any, error) {
	maxRows := operate.DefaultFailureGroupRows
	if v := r.URL.Query().Get("max_rows"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, badRequest("max_rows must be a non-negative integer (0: every row), got %q", v)
		}
		maxRows = n
	}
	return operate.ReadFailureGroups(ctx, h.db, h.config.Schema, maxRows)
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
