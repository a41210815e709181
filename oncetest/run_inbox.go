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
	// The Processor runs what a router would run inside the transaction it lends.
	handler := wmiddleware.Recoverer(wmiddleware.CorrelationID(in.wrap(h)))

	restart := make(chan struct{}, 1)
	in.shutdown = func(string) { restart <- struct{}{} }
	done := make(chan struct{})
	procErr := make(chan error, 1)
	go func() {
		procErr <- k.processInbox(ctx, handler, k.inboxProcessorConfig(consumer, topic, s.concurrent), restart, done)
	}()
	stop := func() error { close(done); return <-procErr }

	if err := storeCopies(ctx, db, recv, copies, s.concurrent); err != nil {
		return errors.Join(fmt.Errorf("inbox Receiver.StoreTx: %w", err), stop())
	}
	if err := waitInboxWorked(ctx, ops, consumer); err != nil {
		return errors.Join(err, stop())
	}
	if err := stop(); err != nil {
		return err
	}
	return recordParked(ctx, ops, consumer, copies, out)
}

// inboxProcessorConfig is the Processor's configuration for a run: quick retries, attempts
// bounded as a broker's redeliveries are, and the own-transaction mode's ShutdownGrace. When
// the schedule delivers at the same time, each worker claims one row at a time: a worker runs
// its claimed batch in sequence, so a batch holding two of the copies would never overlap them
// (CI saw a lost-update check wait for an overlap that one worker's batch of 16 ruled out).
func (k *Kit) inboxProcessorConfig(consumer, topic string, concurrent bool) inbox.ProcessorConfig {
	batch := 0 // the default
	if concurrent {
		batch = 1
	}
	return inbox.ProcessorConfig{
		Schema: k.cfg.Schema, Consumer: consumer, OutputTopic: topic, BatchSize: batch,
		TxOptions: k.middlewareConfig(ModeInbox, consumer, topic).TxOptions,
		Backoff:   time.Millisecond, MaxBackoff: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		ReapInterval: 50 * time.Millisecond, ShutdownGrace: ownTxShutdownGrace, MaxAttempts: maxRedeliveries,
	}
}

// storeCopies stores every copy through recv, each in a transaction of its own: all at the same
// time when concurrent, else in order, stopping at the first error. It returns the first error.
func storeCopies(ctx context.Context, db *sql.DB, recv *inbox.Receiver, copies []copyOf, concurrent bool) error {
	store := func(c copyOf) error {
		return pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{MaxAttempts: 10}, func(ctx context.Context, tx *sql.Tx) error {
			_, err := recv.StoreTx(ctx, tx, inboxTopic, c.msg.Copy())
			return err
		})
	}
	if concurrent {
		return storeAtOnce(copies, store)
	}
	return storeInOrder(copies, store)
}

// storeInOrder stores the copies one after the other, stopping at the first error.
func storeInOrder(copies []copyOf, store func(copyOf) error) error {
	for _, c := range copies {
		if err := store(c); err != nil {
			return err
		}
	}
	return nil
}

// storeAtOnce stores every copy at the same time and returns the first error.
func storeAtOnce(copies []copyOf, store func(copyOf) error) error {
	var storeErr error
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
	return storeErr
}

// waitInboxWorked waits until no row of the run is PENDING or IN_PROGRESS, a minute at most.
func waitInboxWorked(ctx context.Context, ops *inbox.Ops, consumer string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := ops.Stats(ctx, consumer)
		if err != nil {
			return err
		}
		if st.Pending+st.InProgress == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the inbox Processor left %d rows pending and %d in progress after a minute", st.Pending, st.InProgress)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recordParked records each of the run's rows the Processor parked as FAILED in out.
func recordParked(ctx context.Context, ops *inbox.Ops, consumer string, copies []copyOf, out *outcome) error {
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
		out.record(eventOfUUID(event, r.MessageUUID), fmt.Errorf("inbox row of message %s parked as FAILED after %d attempts (%s); the last one failed with: %s",
			r.MessageUUID, r.Attempts, parkedCause(gaveUp), r.LastError), gaveUp)
	}
	return nil
}

// parkedCause says why the Processor parked a row: it kept failing until MaxAttempts (gaveUp),
// or it failed permanently before.
func parkedCause(gaveUp bool) string {
	if gaveUp {
		return "still failing"
	}
	return "failed permanently"
}

// eventOfUUID is the event of the message uuid (-1: none of the run's).
func eventOfUUID(event map[string]int, uuid string) int {
	if e, ok := event[uuid]; ok {
		return e
	}
	return -1
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
