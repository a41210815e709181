package admin

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/outbox"
)

// POST /api/pause
func (h *Handler) pause(ctx context.Context, r *http.Request) (any, error) {
	var p operate.PauseRequest
	if err := decodeBody(r, &p); err != nil {
		return nil, err
	}
	if err := operate.FirstError(
		badRequestIf((strings.TrimSpace(p.Consumer) == "") == (strings.TrimSpace(p.Relay) == ""), "name consumer or relay, one of them"),
		inputError(operate.CheckConsumer("consumer", p.Consumer), operate.CheckConsumer("relay", p.Relay))); err != nil {
		return nil, err
	}
	res, err := operate.SetPaused(ctx, h.db, h.config.Schema, h.ops, p)
	if errors.Is(err, outbox.ErrRelayNotFound) {
		return nil, &apiError{status: http.StatusNotFound, msg: err.Error()}
	}
	if err != nil {
		return nil, err
	}
	if res.Changed {
		h.logger.Info("Paused or resumed from the admin page", watermill.LogFields{"consumer": p.Consumer, "relay": p.Relay, "paused": p.Pause, "remote": r.RemoteAddr})
	}
	return res, nil
}
