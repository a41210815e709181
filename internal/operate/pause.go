package operate

import (
	"context"
	"database/sql"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/outbox"
)

// PauseRequest is the body of POST /api/pause: Consumer (an inbox consumer, inbox.Ops.Pause)
// or Relay (outbox.PauseRelay), one of them; Pause true pauses, false resumes.
type PauseRequest struct {
	Consumer string `json:"consumer,omitempty"`
	Relay    string `json:"relay,omitempty"`
	Pause    bool   `json:"pause"`
}

// PauseResponse says what POST /api/pause did; Changed is false when the consumer or relay
// was in that state already.
type PauseResponse struct {
	Consumer string `json:"consumer,omitempty"`
	Relay    string `json:"relay,omitempty"`
	Paused   bool   `json:"paused"`
	Changed  bool   `json:"changed"`
}

// SetPaused pauses (req.Pause) or resumes the inbox consumer or the relay that req names,
// through their owners: inbox.Ops.Pause and Resume, outbox.PauseRelay and ResumeRelay (whose
// outbox.ErrRelayNotFound it returns for a relay that never ran). The caller has checked that
// req names one of them.
func SetPaused(ctx context.Context, db *sql.DB, schema string, ops *inbox.Ops, req PauseRequest) (PauseResponse, error) {
	res := PauseResponse{Consumer: req.Consumer, Relay: req.Relay, Paused: req.Pause}
	var err error
	if req.Consumer != "" {
		res.Changed, err = pauseConsumer(ctx, ops, req.Consumer, req.Pause)
	} else {
		res.Changed, err = pauseRelay(ctx, db, schema, req.Relay, req.Pause)
	}
	return res, err
}

func pauseConsumer(ctx context.Context, ops *inbox.Ops, consumer string, pause bool) (bool, error) {
	if pause {
		return ops.Pause(ctx, consumer)
	}
	return ops.Resume(ctx, consumer)
}

func pauseRelay(ctx context.Context, db *sql.DB, schema, relay string, pause bool) (bool, error) {
	if pause {
		return outbox.PauseRelay(ctx, db, schema, relay)
	}
	return outbox.ResumeRelay(ctx, db, schema, relay)
}
