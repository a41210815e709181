package oncetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// inboxTopic is the topic the kit's Receiver stores copies as received from.
const inboxTopic = "oncetest"

// runInbox stores every copy through a Receiver (concurrently when s is) and lets a Processor
// work them; the shutdown fault closes the Processor mid-handler and starts another.
func (k *Kit) runInbox(ctx context.Context, h message.HandlerFunc, s schedule, consumer, topic string, in *injector, copies []copyOf, out *outcome) error {
	db, schema := k.cfg.DB, k.cfg.Schema
	recv, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: schema, Consumer: consumer}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer func() { _ = recv.Close() }()
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var txOptions = k.middlewareConfig(ModeInbox, consumer, topic).TxOptions
	pcfg := inbox.ProcessorConfig{
		Schema: schema, Consumer: consumer, OutputTopic: topic, TxOptions: txOptions,
		Backoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		ReapInterval: 50 * time.Millisecond, ShutdownGrace: ownTxShutdownGrace, MaxAttempts: maxRedeliveries,
	}
	// The Processor runs what a router would run inside the transaction it lends.
	handler := wmiddleware.Recoverer(wmiddleware.CorrelationID(in.wrap(h)))

	restart := make(chan struct{}, 1)
	in.shutdown = func(string) { restart <- struct{}{} }
	done := make(chan struct{})
	procErr := make(chan error, 1)
	go func() { procErr <- k.processInbox(ctx, handler, pcfg, restart, done) }()

	store := func(c copyOf) error {
		return pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{MaxAttempts: 10}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := recv.StoreTx(ctx, tx, inboxTopic, c.msg.Copy())
			return err
		})
	}
	var storeErr error
	if s.concurrent {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, c := range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := store(c); err != nil {
					mu.Lock()
					storeErr = cmpErr(storeErr, err)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	} else {
		for _, c := range copies {
			if storeErr = store(c); storeErr != nil {
				break
			}
		}
	}
	stop := func() error { close(done); return <-procErr }
	if storeErr != nil {
		return errors.Join(fmt.Errorf("inbox Receiver.StoreTx: %w", storeErr), stop())
	}
	// Wait until no row of the run is PENDING or IN_PROGRESS.
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := ops.Stats(ctx, consumer)
		if err != nil {
			return errors.Join(err, stop())
		}
		if st.Pending == 0 && st.InProgress == 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("the inbox Processor left %d rows pending and %d in progress after a minute", st.Pending, st.InProgress), stop())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := stop(); err != nil {
		return err
	}
	failed, err := ops.List(ctx, inbox.Filter{Consumer: consumer, Statuses: []inbox.Status{inbox.StatusFailed}}, min(len(copies)+1, inbox.MaxBatchSize))
	if err != nil {
		return err
	}
	event := map[string]int{}
	for _, c := range copies {
		event[c.msg.UUID] = c.event
	}
	for _, r := range failed {
		// A row parked before its last attempt failed permanently (or panicked); one parked
		// at MaxAttempts kept failing.
		gaveUp := r.Attempts >= maxRedeliveries
		what := "failed permanently"
		if gaveUp {
			what = "still failing"
		}
		e, ok := event[r.MessageUUID]
		if !ok {
			e = -1
		}
		out.record(e, fmt.Errorf("inbox row of message %s parked as FAILED after %d attempts (%s); the last one failed with: %s", r.MessageUUID, r.Attempts, what, r.LastError), gaveUp)
	}
	return nil
}

// processInbox runs a Processor until done is closed, replacing it by a new one each time
// restart says the router was shut down.
func (k *Kit) processInbox(ctx context.Context, h message.HandlerFunc, cfg inbox.ProcessorConfig, restart, done <-chan struct{}) error {
	for {
		p, err := inbox.NewProcessor(k.cfg.DB, h, cfg, watermill.NopLogger{})
		if err != nil {
			return err
		}
		ran := make(chan error, 1)
		go func() { ran <- p.Run(ctx) }()
		select {
		case <-done:
			return errors.Join(p.Close(), <-ran)
		case <-restart:
			// Close waits for the handler that asked for the shutdown (up to ShutdownGrace),
			// so it runs beside it.
			if err := errors.Join(p.Close(), <-ran); err != nil {
				return fmt.Errorf("inbox Processor after the shutdown: %w", err)
			}
		}
	}
}
