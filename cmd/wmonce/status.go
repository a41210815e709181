package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/sqlrebase"
)

func statusCommand() *command {
	return &command{
		name:    "status",
		summary: "schema version, consumers, inbox and outbox at a glance",
		usage:   "status [-broker-schema NAME]",
		details: `
Prints the schema version against the latest this binary knows; every consumer with dedupe
claims (count and newest claim); the inbox rows of every consumer by status with the age of
the oldest PENDING row; and every outbox relay's backlog and lag, the topics it holds, a
position recorded on another cluster after a restore (a RESTORED line: run wmonce rebase), and
the number of rows set aside in outbox_rejected. Counting claims and finished inbox rows scans
those tables. -broker-schema (default $BROKER_SQL_SCHEMA) also checks the SQL broker's topic
tables in that schema for ids of another cluster (a restore: RESTORED lines say to run wmonce
rebase -broker-schema). Exit code 1 when the schema has no tables or a section cannot be read.`,
		examples: []string{"wmonce status", "wmonce -schema payments status", "wmonce status -json"},
		actions:  []action{{db: (*env).openMigrated, new: newStatus}},
	}
}

// statusReport is `wmonce status -json`.
type statusReport struct {
	Schema    operate.SchemaStatus    `json:"schema"`
	Consumers []operate.ConsumerStats `json:"consumers"`
	Inbox     []operate.InboxStats    `json:"inbox"`
	Outbox    *operate.OutboxStats    `json:"outbox"`
	// Broker is the SQL broker's topic tables check (-broker-schema); absent without one.
	Broker *sqlrebase.MoveReport `json:"broker,omitempty"`
	Errors []string              `json:"errors,omitempty"`
}

// status is `wmonce status`.
type status struct{ brokerSchema *string }

func newStatus(fs *flag.FlagSet) runner { return status{brokerSchemaFlag(fs)} }

func (st status) run(ctx context.Context, e *env) error {
	var r statusReport
	var err error
	if r.Schema, err = operate.ReadSchemaStatus(ctx, e.db, e.g.schema); err != nil {
		return err
	}
	if err = st.readSections(ctx, e, &r); isUsage(err) {
		return err
	}
	if perr := show(e, r, e.printStatus); perr != nil {
		return perr
	}
	return err
}

// readSections reads each section on its own, so that one missing table (an old schema
// version) does not hide the others; the error lists the sections it could not read.
func (st status) readSections(ctx context.Context, e *env, r *statusReport) error {
	var err error
	var errs []error
	note := func(section string, err error) {
		if err != nil {
			err = fmt.Errorf("%s: %w", section, e.explain(err))
			errs = append(errs, err)
			r.Errors = append(r.Errors, err.Error())
		}
	}
	r.Consumers, err = operate.ReadConsumers(ctx, e.db, e.g.schema, nil)
	note("consumers", err)
	r.Inbox, err = operate.ReadInbox(ctx, e.db, e.g.schema)
	note("inbox", err)
	ob, err := operate.ReadOutbox(ctx, e.db, e.g.schema)
	note("outbox", err)
	if err == nil {
		r.Outbox = &ob
	}
	if r.Broker, err = e.checkBrokerTables(ctx, *st.brokerSchema); isUsage(err) {
		return err
	}
	note("SQL broker topic tables", err)
	if len(errs) > 0 {
		return fmt.Errorf("some sections could not be read:\n%w", errors.Join(errs...))
	}
	return nil
}

func (e *env) printStatus(r statusReport) {
	w := e.stdout
	fmt.Fprintf(w, "Schema %s: version %d (latest %d)\n", r.Schema.Schema, r.Schema.Version, r.Schema.Latest)
	if r.Schema.Hint != "" {
		fmt.Fprintf(w, "  %s\n", r.Schema.Hint)
	}

	fmt.Fprintf(w, "\nConsumers (effectively-once claims)\n")
	if len(r.Consumers) == 0 {
		fmt.Fprintf(w, "  none yet\n")
	} else {
		e.printConsumers(r.Consumers)
	}

	fmt.Fprintf(w, "\nInbox\n")
	if len(r.Inbox) == 0 {
		fmt.Fprintf(w, "  empty\n")
	} else {
		e.printInboxStats(r.Inbox)
	}

	fmt.Fprintf(w, "\nOutbox\n")
	if r.Outbox != nil {
		e.printOutbox(*r.Outbox)
	}
	if r.Broker != nil {
		fmt.Fprintf(w, "\nSQL broker (schema %s)\n", r.Broker.Schema)
		e.printBrokerTables(r.Broker, "  ")
	}
}

func (e *env) printConsumers(cs []operate.ConsumerStats) {
	tw := e.table()
	fmt.Fprintf(tw, "  CONSUMER\tCLAIMS\tNEWEST CLAIM\n")
	for _, c := range cs {
		fmt.Fprintf(tw, "  %s\t%d\t%s\n", c.Consumer, c.Claims, whenSet(c.NewestClaim))
	}
	_ = tw.Flush()
}

func (e *env) printInboxStats(st []operate.InboxStats) {
	tw := e.table()
	fmt.Fprintf(tw, "  CONSUMER\tPENDING\tRETRYING\tIN_PROGRESS\tFAILED\tDONE\tSKIPPED\tOLDEST PENDING\n")
	for _, s := range st {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", s.Consumer, s.Pending, s.Retrying, s.InProgress, s.Failed, s.Done, s.Skipped, seconds(s.OldestPendingAgeSeconds))
	}
	_ = tw.Flush()
	for _, s := range st {
		if s.Failed > 0 {
			fmt.Fprintf(e.stdout, "  %d FAILED row(s) of %s are parked: `wmonce failures list` groups them by cause (or `wmonce inbox list -consumer %s -status FAILED`), then replay or skip them\n", s.Failed, s.Consumer, shellQuote(s.Consumer))
		}
	}
	e.printInboxPauses(st)
}

func (e *env) printOutbox(o operate.OutboxStats) {
	if len(o.Relays) == 0 {
		fmt.Fprintf(e.stdout, "  no relay has run on this schema yet\n")
	} else {
		tw := e.table()
		fmt.Fprintf(tw, "  RELAY\tBACKLOG\tOLDEST WAITING ROW\tLAG\n")
		for _, r := range o.Relays {
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\n", r.Name, r.Backlog, whenSet(r.OldestPending), seconds(r.LagSeconds))
		}
		_ = tw.Flush()
	}
	for _, r := range o.Relays {
		for _, h := range r.Held {
			fmt.Fprintf(e.stdout, "  relay %s holds topic %s: %d row(s) wait since %s because publishing to it fails (the log says why); the other topics go on\n",
				r.Name, h.Topic, h.Rows, when(h.Since))
		}
	}
	for _, r := range o.Relays {
		if r.Moved {
			fmt.Fprintf(e.stdout, "  RESTORED: %s\n", r.Finding)
		}
	}
	e.printRelayPauses(o)
	if o.Rejected > 0 {
		fmt.Fprintf(e.stdout, "  %d row(s) were set aside in outbox_rejected (undecodable, or refused by the broker for good): `wmonce outbox rejected` lists them, `wmonce outbox republish` stores them again\n", o.Rejected)
	} else {
		fmt.Fprintf(e.stdout, "  rejected rows: 0\n")
	}
}

func dedupeCommand() *command {
	return &command{
		name:    "dedupe",
		summary: "was message M processed by consumer C, and when",
		usage:   "dedupe -consumer C -message M",
		details: `
Looks the message's dedupe key up in the effectively-once claims (processed_messages and its
daily partitions) and in the consumer's inbox. M is the key the consumer dedupes on: the
Watermill UUID unless the consumer was configured with another KeyFunc. No record means the
message was never applied by that consumer, or its record was deleted by retention. The exit
code is 0 either way; scripts read "processed" from -json.`,
		examples: []string{
			"wmonce dedupe -consumer rewards -message 0d6f8c1e-6a43-4c1f-9a0e-2d1c5b7f9e10",
			"wmonce -json dedupe -consumer rewards -message order-42",
		},
		actions: []action{{db: (*env).openMigrated, new: newDedupe}},
	}
}

// dedupe is `wmonce dedupe`.
type dedupe struct{ consumer, message string }

func newDedupe(fs *flag.FlagSet) runner {
	d := &dedupe{}
	fs.StringVar(&d.consumer, "consumer", "", "consumer name (the middleware's Consumer or the inbox consumer)")
	fs.StringVar(&d.message, "message", "", "the message's dedupe key (by default its Watermill UUID)")
	return d
}

func (d *dedupe) check([]string) error {
	return operate.FirstError(
		usageIf(d.consumer == "" || d.message == "", "give both -consumer and -message"),
		checkInput(operate.CheckConsumer("-consumer", d.consumer), operate.CheckText("-message", d.message)))
}

func (d *dedupe) run(ctx context.Context, e *env) error {
	p, err := operate.LookupProcessed(ctx, e.db, e.g.schema, d.consumer, d.message)
	if err != nil {
		return err
	}
	return show(e, p, func(p operate.Processed) { printProcessed(e.stdout, p) })
}

// printProcessed says whether p's message was applied, with its claim and inbox row.
func printProcessed(w io.Writer, p operate.Processed) {
	switch {
	case p.Claim != nil:
		fmt.Fprintf(w, "processed: message %q was applied by consumer %q at %s\n", p.Key, p.Consumer, when(p.Claim.ProcessedAt))
		fmt.Fprintf(w, "  claim payload sha256 %s", p.Claim.PayloadSHA256)
		if p.Claim.OccurredOn != nil {
			fmt.Fprintf(w, ", partition day %s", p.Claim.OccurredOn.Format("2006-01-02"))
		}
		fmt.Fprintln(w)
	case p.Processed:
		fmt.Fprintf(w, "processed: message %q was applied by consumer %q at %s (inbox)\n", p.Key, p.Consumer, when(*p.Inbox.FinishedAt))
	case p.Inbox != nil:
		fmt.Fprintf(w, "not processed: message %q is in the inbox of consumer %q but not applied\n", p.Key, p.Consumer)
	default:
		fmt.Fprintf(w, "not processed: no record of message %q for consumer %q\n", p.Key, p.Consumer)
	}
	if p.Inbox != nil {
		fmt.Fprintf(w, "  inbox row %d: %s, %d attempt(s), received %s", p.Inbox.ID, p.Inbox.Status, p.Inbox.Attempts, when(p.Inbox.ReceivedAt))
		if p.Inbox.FinishedAt != nil {
			fmt.Fprintf(w, ", finished %s", when(*p.Inbox.FinishedAt))
		}
		fmt.Fprintln(w)
		if p.Inbox.LastError != "" {
			fmt.Fprintf(w, "  last error: %s\n", p.Inbox.LastError)
		}
	}
	if !p.Processed && p.Inbox == nil {
		fmt.Fprintf(w, "  it was never applied by this consumer, or its record was deleted by retention; check the consumer name and that the key is the one it dedupes on\n")
	}
}
