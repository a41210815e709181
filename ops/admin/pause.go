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
	if (strings.TrimSpace(p.Consumer) == "") == (strings.TrimSpace(p.Relay) == "") {
		return nil, badRequest("name consumer or relay, one of them")
	}
	if err := operate.FirstError(operate.CheckConsumer("consumer", p.Consumer), operate.CheckConsumer("relay", p.Relay)); err != nil {
		return nil, badRequest("%v", err)
	}
	res := operate.PauseResponse{Consumer: p.Consumer, Relay: p.Relay, Paused: p.Pause}
	var err error
	switch {
	case p.Consumer != "" && p.Pause:
		res.Changed, err = h.ops.Pause(ctx, p.Consumer)
	case p.Consumer != "":
		res.Changed, err = h.ops.Resume(ctx, p.Consumer)
	case p.Pause:
		res.Changed, err = outbox.PauseRelay(ctx, h.db, h.config.Schema, p.Relay)
	default:
		res.Changed, err = outbox.ResumeRelay(ctx, h.db, h.config.Schema, p.Relay)
	}
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
