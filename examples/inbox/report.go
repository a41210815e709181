package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/wmonce/watermill-once/inbox"
)

// summary is what a run observed, for the printout and the test.
type summary struct {
	Published       int // distinct valid events
	DuplicateCopies int // extra copies published
	Receiver        inbox.ReceiverCounters
	Processor       inbox.ProcessorCounters
	CashbackRows    int // cashback rows of this run
	GrantedInOutbox int // CashbackGranted messages of this run in the outbox
	Poisoned        int // refused messages parked by the poison-queue middleware
	ParkedRows      []inbox.Row
	Skipped         int
	OrderViolations int32

	publishing, elapsed time.Duration // publishing the batch; from the first publish until done
}

// report counts the run's effects in the database into s, prints s and checks it.
func (e *env) report(ctx context.Context, s *summary, b *batch, w io.Writer) error {
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+e.cashback+` WHERE payment_id LIKE $1`, e.runID+"-%").Scan(&s.CashbackRows); err != nil {
		return err
	}
	ob := e.writer.Table()
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+ob+` WHERE payload->>'destination_topic' = $1 AND uuid LIKE $2`, grantedTopic, "granted-"+e.runID+"-%").Scan(&s.GrantedInOutbox); err != nil {
		return err
	}
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+ob+` WHERE payload->>'destination_topic' = $1 AND uuid = $2`, poisonTopic, b.anonymousUUID).Scan(&s.Poisoned); err != nil {
		return err
	}
	stats, err := e.ops.Stats(ctx, consumer)
	if err != nil {
		return err
	}

	fmt.Fprintf(w, "broker %s, topic %q, consumer %q, run %s\n", e.broker.Kind(), e.topic, consumer, e.runID)
	fmt.Fprintf(w, "published %d events + %d duplicate copies + 1 undecodable + 1 without payment id in %s\n",
		s.Published, s.DuplicateCopies, s.publishing.Round(time.Millisecond))
	fmt.Fprintf(w, "receiver:  %d rows stored, %d copies acked as duplicates, %d refused (parked on %s: %d), %d statements\n",
		s.Receiver.Stored, s.Receiver.Duplicates, s.Receiver.Refused, poisonTopic, s.Poisoned, s.Receiver.Batches)
	fmt.Fprintf(w, "processor: %d applied, %d failed attempts, %d parked, %d lease conflicts; done %s after the first publish\n",
		s.Processor.Processed, s.Processor.Failed, s.Processor.Parked, s.Processor.LeaseConflicts, s.elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "effects:   %d cashback rows, %d CashbackGranted messages in the outbox, %d per-account order violations\n",
		s.CashbackRows, s.GrantedInOutbox, s.OrderViolations)
	for _, r := range s.ParkedRows {
		fmt.Fprintf(w, "parked:    row %d, message %s, key %s, %d attempt(s), error: %s\n", r.ID, r.MessageID, r.OrderingKey, r.Attempts, r.LastError)
	}
	fmt.Fprintf(w, "skipped %d parked row(s); inbox now: %d pending, %d in progress, %d failed\n",
		s.Skipped, stats.Pending, stats.InProgress, stats.Failed)
	if s.CashbackRows != s.Published || s.OrderViolations != 0 || s.Poisoned != 1 || len(s.ParkedRows) != 1 {
		return errors.New("unexpected outcome: see the lines above")
	}
	return nil
}
