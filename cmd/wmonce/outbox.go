package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/outboxops"
)

func outboxCommand() *command {
	return &command{
		name:    "outbox",
		summary: "relays' backlog, lag and held topics; rejected rows: list, inspect, republish; forget a relay",
		usage: `
outbox [stats]
outbox rejected [-relay R] [-after OFFSET] [-limit N]
outbox inspect OFFSET [-relay R]
outbox republish -relay R (-offset N[,N] | -all) [-remove-metadata KEY] [-dry-run]
outbox forget -relay R [-dry-run]`,
		details: `
stats      every relay's backlog (rows it has not forwarded yet) and lag (the age of the oldest
           of them), the topics it holds because publishing to them fails (their rows wait in
           outbox_held; the other topics go on), and the number of rejected rows. A relay
           that has never run is not listed. (status is an older name for it.)
rejected   rows a relay set aside in outbox_rejected, because it could not decode them or the
           broker refused them for good, in offset order, 50 at a time; page on with -after.
inspect    one rejected row with its payload, metadata and the error.
republish  stores rejected rows of relay R in the outbox again, at its end (same UUID), and
           removes them from outbox_rejected: fix what made the broker refuse them first.
           -remove-metadata drops a metadata key on the way (one the broker reserves; repeat
           it for several). Rows that cannot be decoded stay rejected. -dry-run only counts.
           A republish that matches no rejected row (none at those offsets, or another
           republish took them first) exits 1.
forget     deletes the position of a relay that was retired for good, and the rows it held,
           so that it no longer holds back outbox cleanup. Refused while an instance of it
           runs; stop its standbys too (a relay of that name that starts later begins again at
           the oldest row in the outbox). -dry-run shows what it would forget.`,
		examples: []string{
			"wmonce outbox",
			"wmonce -json outbox",
			"wmonce outbox rejected -relay kafka",
			"wmonce outbox inspect 1842 -relay kafka",
			"wmonce outbox republish -relay kafka -offset 1842 -dry-run",
			"wmonce outbox republish -relay kafka -all -remove-metadata _watermill_message_uuid",
			"wmonce outbox forget -relay audit-2024 -dry-run",
		},
		actions: []action{
			// status: its name before the module said stats for database figures
			{name: "stats", aliases: []string{"status"}, db: (*env).openMigrated, new: report(operate.ReadOutbox, (*env).printOutbox)},
			{name: "rejected", db: (*env).openMigrated, new: newOutboxRejected},
			{name: "inspect", args: true, db: (*env).openMigrated, new: newOutboxInspect},
			{name: "republish", db: (*env).openMigrated, new: newOutboxRepublish},
			{name: "forget", db: (*env).openMigrated, new: newOutboxForget},
		},
	}
}

// outboxRejected is `wmonce outbox rejected`.
type outboxRejected struct {
	relay string
	after int64
	limit int
}

func newOutboxRejected(fs *flag.FlagSet) runner {
	o := &outboxRejected{}
	fs.StringVar(&o.relay, "relay", "", "only the rows this relay rejected")
	fs.Int64Var(&o.after, "after", 0, "show rows after this outbox offset (paging)")
	fs.IntVar(&o.limit, "limit", 50, "rows to show (1-"+strconv.Itoa(operate.MaxListLimit)+")")
	return o
}

func (o *outboxRejected) check([]string) error {
	return operate.FirstError(
		checkInput(operate.CheckConsumer("-relay", o.relay)),
		usageIf(o.limit < 1 || o.limit > operate.MaxListLimit, "-limit must be between 1 and %d", operate.MaxListLimit),
		usageIf(o.after < 0, "-after must be an outbox offset"))
}

func (o *outboxRejected) run(ctx context.Context, e *env) error {
	rows, err := operate.ListRejected(ctx, e.db, e.g.schema, outboxops.RejectedFilter{Relay: o.relay, AfterOffset: o.after}, o.limit, false)
	if err != nil {
		return err
	}
	return show(e, rows, o.print(e))
}

// print prints the rows as a table, and how to page on after a full page (of distinct offsets:
// a row several relays rejected is listed once per relay).
func (o *outboxRejected) print(e *env) func([]operate.RejectedRow) {
	return func(rows []operate.RejectedRow) {
		if len(rows) == 0 {
			fmt.Fprintln(e.stdout, "no rejected outbox rows")
			return
		}
		tw := e.table()
		fmt.Fprintf(tw, "OFFSET\tRELAY\tUUID\tTOPIC\tREJECTED\tERROR\n")
		for _, r := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", r.Offset, r.Relay, truncate(r.UUID, 40), orDash(truncate(r.Topic, 32)),
				r.RejectedAt.Local().Format("2006-01-02 15:04:05"), truncate(r.LastError, 70))
		}
		_ = tw.Flush()
		if distinct := countOffsets(rows); distinct == o.limit {
			fmt.Fprintf(e.stdout, "more rows may follow: add -after %d\n", rows[len(rows)-1].Offset)
		}
	}
}

func countOffsets(rows []operate.RejectedRow) int {
	n := 0
	for i, r := range rows {
		if i == 0 || r.Offset != rows[i-1].Offset {
			n++
		}
	}
	return n
}

// outboxInspect is `wmonce outbox inspect OFFSET`.
type outboxInspect struct {
	relay  string
	offset int64
}

func newOutboxInspect(fs *flag.FlagSet) runner {
	o := &outboxInspect{}
	fs.StringVar(&o.relay, "relay", "", "the relay that rejected it (needed when several did)")
	return o
}

func (o *outboxInspect) check(rest []string) error {
	if len(rest) != 1 {
		return usagef("give the outbox offset of one rejected row (`wmonce outbox rejected` lists them)")
	}
	var err error
	o.offset, err = strconv.ParseInt(rest[0], 10, 64)
	return operate.FirstError(
		usageIf(err != nil || o.offset < 1, "the outbox offset must be a positive integer, got %q", rest[0]),
		checkInput(operate.CheckConsumer("-relay", o.relay)))
}

func (o *outboxInspect) run(ctx context.Context, e *env) error {
	rows, err := operate.ListRejected(ctx, e.db, e.g.schema, outboxops.RejectedFilter{Relay: o.relay, Offset: o.offset}, 1, true)
	if err != nil {
		return err
	}
	switch {
	case len(rows) == 0:
		return fmt.Errorf("no rejected outbox row at offset %d%s (`wmonce outbox rejected` lists them)", o.offset, forRelay(o.relay))
	case len(rows) > 1:
		return usagef("outbox row %d was rejected by relays %s: give -relay", o.offset, strings.Join(relayNames(rows), ", "))
	}
	return show(e, rows[0], e.printRejectedRow)
}

func relayNames(rows []operate.RejectedRow) []string {
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = r.Relay
	}
	return names
}

// printRejectedRow prints one rejected row as a table of fields, its payload, and how to
// republish it.
func (e *env) printRejectedRow(r operate.RejectedRow) {
	w := e.table()
	fmt.Fprintf(w, "offset\t%d\n", r.Offset)
	fmt.Fprintf(w, "relay\t%s\n", r.Relay)
	fmt.Fprintf(w, "uuid\t%s\n", r.UUID)
	fmt.Fprintf(w, "topic\t%s\n", orDash(r.Topic))
	fmt.Fprintf(w, "source\t%s\n", orDash(r.Source))
	fmt.Fprintf(w, "transaction\t%s\n", r.TransactionID)
	fmt.Fprintf(w, "rejected\t%s\n", when(r.RejectedAt))
	fmt.Fprintf(w, "error\t%s\n", r.LastError)
	fmt.Fprintf(w, "metadata\t%s\n", orDash(string(r.Metadata)))
	_ = w.Flush()
	payload := "(none)"
	if r.Payload != nil {
		payload = *r.Payload
	}
	fmt.Fprintf(e.stdout, "payload (the stored envelope, %d bytes):\n%s\n", r.PayloadSize, payload)
	if r.Topic != "" {
		fmt.Fprintf(e.stdout, "once its cause is fixed: wmonce -schema %s outbox republish -relay %s -offset %d\n", shellQuote(e.g.schema), shellQuote(r.Relay), r.Offset)
	}
}

func forRelay(relay string) string {
	if relay == "" {
		return ""
	}
	return fmt.Sprintf(" for relay %q", relay)
}

// outboxRepublish is `wmonce outbox republish`.
type outboxRepublish struct {
	req             operate.RepublishRequest
	offsets, remove listFlag
}

func newOutboxRepublish(fs *flag.FlagSet) runner {
	o := &outboxRepublish{offsets: listFlag{split: true}}
	fs.StringVar(&o.req.Relay, "relay", "", "the relay that rejected the rows (required)")
	fs.Var(&o.offsets, "offset", "outbox offsets of the rejected rows, comma-separated or repeated")
	fs.BoolVar(&o.req.All, "all", false, "every row the relay rejected")
	fs.Var(&o.remove, "remove-metadata", "metadata key to remove before storing the rows again; repeat for several")
	fs.BoolVar(&o.req.DryRun, "dry-run", false, "count the rows that would be republished, change nothing")
	return o
}

// check reads the -offset values and checks the selection: a relay, and -offset or -all but
// not both.
func (o *outboxRepublish) check([]string) (err error) {
	o.req.RemoveMetadata = o.remove.values
	o.req.Offsets, err = parseIDs(o.offsets.values, "-offset", "outbox offsets")
	return operate.FirstError(err,
		required(o.req.Relay, "-relay is required: the relay that rejected the rows (`wmonce outbox rejected` shows it)"),
		usageIf(len(o.req.Offsets) == 0 && !o.req.All, "name the rows with -offset, or give -all to republish every row relay %q rejected", o.req.Relay),
		usageIf(len(o.req.Offsets) > 0 && o.req.All, "give -offset or -all, not both"),
		checkInput(operate.CheckConsumer("-relay", o.req.Relay), operate.CheckText("-remove-metadata", o.req.RemoveMetadata...)))
}

// errNothingRepublished is a republish that matched no rejected row: the offsets are not (or no
// longer) rejected by the relay, or it rejected none. Like `failures replay` of an emptied
// group, it exits 1, so that a script does not read "0 rows" as done.
var errNothingRepublished = errors.New("nothing to republish")

func (o *outboxRepublish) run(ctx context.Context, e *env) error {
	res, err := operate.Republish(ctx, e.db, e.g.schema, o.req)
	if err != nil {
		return err
	}
	if err := show(e, res, o.print(e)); err != nil {
		return err
	}
	if res.Republished == 0 && len(res.Undecodable) == 0 {
		return fmt.Errorf("%w: relay %q has no rejected row%s (another republish may have taken them first); `wmonce outbox rejected -relay %s` lists them",
			errNothingRepublished, o.req.Relay, atOffsets(o.req.Offsets), shellQuote(o.req.Relay))
	}
	return nil
}

func atOffsets(offsets []int64) string {
	if len(offsets) == 0 {
		return ""
	}
	return " at offsets " + joinInts(offsets, ",")
}

// print reports what `outbox republish` did, or would do on a dry run.
func (o *outboxRepublish) print(e *env) func(operate.RepublishResponse) {
	return func(res operate.RepublishResponse) {
		if o.req.DryRun {
			fmt.Fprintf(e.stdout, "dry run: would republish %d row(s) rejected by relay %q; run again without -dry-run to do it\n", res.Republished, res.Relay)
		} else {
			fmt.Fprintf(e.stdout, "republished %d row(s) rejected by relay %q (offsets %s): they are at the end of the outbox, and every relay of their source forwards them\n", res.Republished, res.Relay, orDash(joinInts(res.Offsets, ",")))
		}
		if len(res.Undecodable) > 0 {
			fmt.Fprintf(e.stdout, "%d selected row(s) cannot be decoded and stay rejected (offsets %s): republishing them would only reject them again\n", len(res.Undecodable), joinInts(res.Undecodable, ", "))
		}
	}
}

// outboxForget is `wmonce outbox forget`.
type outboxForget struct{ req operate.ForgetRequest }

func newOutboxForget(fs *flag.FlagSet) runner {
	o := &outboxForget{}
	fs.StringVar(&o.req.Relay, "relay", "", "name of the retired relay (its RelayConfig.Name; required)")
	fs.BoolVar(&o.req.DryRun, "dry-run", false, "show what would be forgotten, change nothing")
	return o
}

func (o *outboxForget) check([]string) error {
	return operate.FirstError(
		required(o.req.Relay, "-relay is required: the name of the retired relay (`wmonce outbox` lists the relays)"),
		checkInput(operate.CheckConsumer("-relay", o.req.Relay)))
}

func (o *outboxForget) run(ctx context.Context, e *env) error {
	res, err := operate.ForgetRelay(ctx, e.db, e.g.schema, o.req) // outbox.ErrRelayActive says to stop the relay first
	if err != nil {
		return err
	}
	return show(e, res, e.printForgotten)
}

// printForgotten says what `outbox forget` forgot, or would forget on a dry run.
func (e *env) printForgotten(res operate.ForgetResponse) {
	what := fmt.Sprintf("relay %q (source %q): %d row(s) it had not forwarded", res.Relay, res.Stats.Source, res.Backlog)
	for _, h := range res.Held {
		what += fmt.Sprintf("; held topic %s, %d row(s)", h.Topic, h.Rows)
	}
	if res.DryRun {
		fmt.Fprintf(e.stdout, "dry run: would forget %s; run again without -dry-run to forget it\n", what)
		return
	}
	fmt.Fprintf(e.stdout, "forgot %s; it no longer holds back outbox cleanup\n", what)
	if res.Backlog > 0 {
		fmt.Fprintf(e.stdout, "no relay of that name forwards those rows any more; one started later under that name begins again at the oldest row in the outbox\n")
	}
}
