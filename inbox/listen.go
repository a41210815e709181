package inbox

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/pgnotify"
	iworker "github.com/wmonce/watermill-once/internal/worker"
)

// listen keeps a dedicated connection LISTENing on the schema's channel and wakes idle workers
// when rows for this consumer arrive. Without it, workers poll every PollInterval.
func (p *Processor) listen(ctx context.Context) {
	if p.config.DisableListen {
		return
	}
	err := pgnotify.Listener{
		DB: p.db,
		Channels: map[string]func(string){p.q.channel: func(payload string) {
			if payload == p.config.Consumer {
				p.wakeAll()
			}
		}},
		OnListen: p.wakeAll, // rows may have arrived while nobody listened
		OnLost: func(err error, backoff time.Duration) {
			p.errs.Add(1)
			p.logger.Error("LISTEN connection lost; polling until it is back", err, watermill.LogFields{"backoff": backoff})
		},
	}.Run(ctx)
	if errors.Is(err, pgnotify.ErrNotPgx) {
		p.logger.Info("LISTEN/NOTIFY unavailable, idle workers poll every PollInterval", watermill.LogFields{"reason": err.Error(), "poll_interval": p.config.PollInterval})
	}
}

// wakeAll tells idle workers to claim now.
func (p *Processor) wakeAll() {
	for range p.config.Workers {
		select {
		case p.wake <- struct{}{}:
		default:
			return
		}
	}
}

func (p *Processor) idle(ctx context.Context) {
	t := time.NewTimer(iworker.Jitter(p.config.PollInterval))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-p.wake:
	case <-t.C:
	}
}
