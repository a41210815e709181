package admin

import (
	"context"
	"errors"
	"net/http"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/outbox"
)

// POST /api/outbox/republish
func (h *Handler) republish(ctx context.Context, r *http.Request) (any, error) {
	var req operate.RepublishRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	out, err := operate.Republish(ctx, h.db, h.config.Schema, req)
	if err != nil {
		return nil, err
	}
	if !req.DryRun {
		h.logger.Info("Rejected outbox rows republished from the admin page", watermill.LogFields{"relay": req.Relay, "rows": out.Republished, "offsets": out.Offsets, "remote": r.RemoteAddr})
	}
	return out, nil
}

// POST /api/outbox/forget
func (h *Handler) forget(ctx context.Context, r *http.Request) (any, error) {
	var req operate.ForgetRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	out, err := operate.ForgetRelay(ctx, h.db, h.config.Schema, req)
	switch {
	case errors.Is(err, operate.ErrRelayNotFound):
		return nil, &apiError{status: http.StatusNotFound, msg: err.Error()}
	case errors.Is(err, outbox.ErrRelayActive):
		return nil, &apiError{status: http.StatusConflict, msg: err.Error()}
	case err != nil:
		return nil, err
	}
	if !req.DryRun {
		h.logger.Info("Relay forgotten from the admin page", watermill.LogFields{"relay": req.Relay, "backlog": out.Backlog, "remote": r.RemoteAddr})
	}
	return out, nil
}
