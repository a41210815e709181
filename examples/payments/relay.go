package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/outbox"
)

// relayThenCrash runs a relay whose process "dies" right after its first publish, before it
// records its position: its publisher cancels the relay's context and fails.
func relayThenCrash(ctx context.Context, db *sql.DB, pub message.Publisher, cfg outbox.RelayConfig) error {
	crashCtx, crash := context.WithCancel(ctx)
	defer crash()
	crashing := &publishThenCrash{next: pub, crash: crash}
	relay, err := outbox.NewRelay(db, crashing, cfg, watermill.NopLogger{}) // its crash is narrated
	if err != nil {
		return err
	}
	return untilDone(ctx, "relay #1 publishing e-91", func() (bool, error) {
		_, err := relay.RelayOnce(crashCtx)
		return crashing.crashed.Load(), ignoreCrash(err, crashCtx)
	})
}

// transportStamper gives every physical publish a new transport_id, the way a broker gives every
// copy a new offset or delivery tag: it changes with each copy, the event id (UUID) does not.
type transportStamper struct {
	next   message.Publisher
	lastID atomic.Value
}

func (p *transportStamper) Publish(topic string, msgs ...*message.Message) error {
	copies := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		c := m.Copy()
		id := "t-" + shortID()
		c.Metadata.Set("transport_id", id)
		p.lastID.Store(id)
		copies[i] = c
	}
	return p.next.Publish(topic, copies...)
}

func (p *transportStamper) Close() error { return nil }

func (p *transportStamper) last() string {
	s, _ := p.lastID.Load().(string)
	return s
}

// publishThenCrash publishes, then behaves like a process that died before the relay recorded
// its position: it cancels the relay's context and fails.
type publishThenCrash struct {
	next    message.Publisher
	crash   context.CancelFunc
	crashed atomic.Bool
}

var errRelayCrashed = errors.New("relay process crashed after publishing")

func (p *publishThenCrash) Publish(topic string, msgs ...*message.Message) error {
	if err := p.next.Publish(topic, msgs...); err != nil {
		return err
	}
	p.crashed.Store(true)
	p.crash()
	return errRelayCrashed
}

func (p *publishThenCrash) Close() error { return nil }

func ignoreCrash(err error, crashCtx context.Context) error {
	if err == nil || crashCtx.Err() != nil {
		return nil
	}
	return err
}

// untilDone calls fn until it reports done (the relay only sees rows once older transactions
// on the server have finished, so a round can find nothing at first).
func untilDone(ctx context.Context, what string, fn func() (bool, error)) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		done, err := fn()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func waitFor(ctx context.Context, what string, cond func() bool) error {
	return untilDone(ctx, what, func() (bool, error) { return cond(), nil })
}
