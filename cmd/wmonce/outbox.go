package main

import (
	"context"
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
			{name: "stats", aliases: []string{"status"}, run: (*env).outboxStats},
			{name: "rejected", run: (*env).outboxRejected},
			{name: "inspect", run: (*env).outboxInspect},
			{name: "republish", run: (*env).outboxRepublish},
			{name: "forget", run: (*env).outboxForget},
		},
	}
}

func (e *env) outboxStats(ctx context.Context, args []string) error {
	return readAndShow(ctx, e, "outbox", args, operate.ReadOutbox, e.printOutbox)
}

func (e *env) outboxRejected(ctx context.Context, args []string) error {
	fs := e.flags("outbox rejected")
	relay := fs.String("relay", "", "only the rows this relay rejected")
	after := fs.Int64("after", 0, "show rows after this outbox offset (paging)")
	limit := fs.Int("limit", 50, "rows to show (1-"+strconv.Itoa(operate.MaxListLimit)+")")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if err := checkInput(operate.CheckConsumer("-relay", *relay)); err != nil {
		return err
	}
	if *limit < 1 || *limit > operate.MaxListLimit {
		return usagef("-limit must be between 1 and %d", operate.MaxListLimit)
	}
	if *after < 0 {
		return usagef("-after must be an outbox offset")
	}
	db, err := e.openMigrated(ctx)
	if err != nil {
		return err
	}
	rows, err := operate.ListRejected(ctx, db, e.g.schema, outboxops.RejectedFilter{Relay: *relay, AfterOffset: *after}, *limit, false)
	if err != nil {
		return e.explain(err)
	}
	if e.g.json {
		return e.printJSON(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintln(e.stdout, "no rejected outbox rows")
		return nil
	}
	tw := e.table()
	fmt.Fprintf(tw, "OFFSET\tRELAY\tUUID\tTOPIC\tREJECTED\tERROR\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", r.Offset, r.Relay, truncate(r.UUID, 40), orDash(truncate(r.Topic, 32)),
			r.RejectedAt.Local().Format("2006-01-02 15:04:05"), truncate(r.LastError, 70))
	}
	_ = tw.Flush()
	if distinct := countOffsets(rows); distinct == *limit {
		fmt.Fprintf(e.stdout, "more rows may follow: add -after %d\n", rows[len(rows)-1].Offset)
	}
	return nil
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

func (e *env) outboxInspect(ctx context.Context, args []string) error {
	fs := e.flags("outbox inspect")
	relay := fs.String("relay", "", "the relay that rejected it (needed when several did)")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return usagef("give the outbox offset of one rejected row (`wmonce outbox rejected` lists them)")
	}
	offset, err := strconv.ParseInt(rest[0], 10, 64)
	if err != nil || offset < 1 {
		return usagef("the outbox offset must be a positive integer, got %q", rest[0])
	}
	if err := checkInput(operate.CheckConsumer("-relay", *relay)); err != nil {
		return err
	}
	db, err := e.openMigrated(ctx)
	if err != nil {
		return err
	}
	rows, err := operate.ListRejected(ctx, db, e.g.schema, outboxops.RejectedFilter{Relay: *relay, Offset: offset}, 1, true)
	if err != nil {
		return e.explain(err)
	}
	switch {
	case len(rows) == 0:
		return fmt.Errorf("no rejected outbox row at offset %d%s (`wmonce outbox rejected` lists them)", offset, forRelay(*relay))
	case len(rows) > 1:
		names := make([]string, len(rows))
		for i, r := range rows {
			names[i] = r.Relay
		}
		return usagef("outbox row %d was rejected by relays %s: give -relay", offset, strings.Join(names, ", "))
	}
	r := rows[0]
	if e.g.json {
		return e.printJSON(r)
	}
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
	return nil
}

func forRelay(relay string) string {
	if relay == "" {
		return ""
	}
	return fmt.Sprintf(" for relay %q", relay)
}

func (e *env) outboxRepublish(ctx context.Context, args []string) error {
	fs := e.flags("outbox republish")
	relay := fs.String("relay", "", "the relay that rejected the rows (required)")
	offsets := &listFlag{split: true}
	fs.Var(offsets, "offset", "outbox offsets of the rejected rows, comma-separated or repeated")
	all := fs.Bool("all", false, "every row the relay rejected")
	remove := &listFlag{}
	fs.Var(remove, "remove-metadata", "metadata key to remove before storing the rows again; repeat for several")
	dryRun := fs.Bool("dry-run", false, "count the rows that would be republished, change nothing")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	req := operate.RepublishRequest{Relay: *relay, All: *all, RemoveMetadata: remove.values, DryRun: *dryRun}
	if err := checkRepublishFlags(&req, offsets.values); err != nil {
		return err
	}
	db, err := e.openMigrated(ctx)
	if err != nil {
		return err
	}
	res, err := operate.Republish(ctx, db, e.g.schema, req)
	if err != nil {
		return e.explain(err)
	}
	if e.g.json {
		return e.printJSON(res)
	}
	e.printRepublished(res, *relay, *dryRun)
	return nil
}

// checkRepublishFlags parses the -offset values into req.Offsets and checks the selection:
// a relay, and -offset or -all but not both.
func checkRepublishFlags(req *operate.RepublishRequest, offsets []string) error {
	for _, v := range offsets {
		o, err := strconv.ParseInt(v, 10, 64)
		if err != nil || o < 1 {
			return usagef("-offset takes positive outbox offsets, got %q", v)
		}
		req.Offsets = append(req.Offsets, o)
	}
	switch {
	case strings.TrimSpace(req.Relay) == "":
		return usagef("-relay is required: the relay that rejected the rows (`wmonce outbox rejected` shows it)")
	case len(req.Offsets) == 0 && !req.All:
		return usagef("name the rows with -offset, or give -all to republish every row relay %q rejected", req.Relay)
	case len(req.Offsets) > 0 && req.All:
		return usagef("give -offset or -all, not both")
	}
	return checkInput(operate.CheckConsumer("-relay", req.Relay), operate.CheckText("-remove-metadata", req.RemoveMetadata...))
}

// printRepublished reports what `outbox republish` did, or would do on a dry run.
func (e *env) printRepublished(res operate.RepublishResponse, relay string, dryRun bool) {
	if dryRun {
		fmt.Fprintf(e.stdout, "dry run: would republish %d row(s) rejected by relay %q; run again without -dry-run to do it\n", res.Republished, relay)
	} else {
		fmt.Fprintf(e.stdout, "republished %d row(s) rejected by relay %q (offsets %s): they are at the end of the outbox, and every relay of their source forwards them\n", res.Republished, relay, orDash(joinInts(res.Offsets, ",")))
	}
	if len(res.Undecodable) > 0 {
		fmt.Fprintf(e.stdout, "%d selected row(s) cannot be decoded and stay rejected (offsets %s): republishing them would only reject them again\n", len(res.Undecodable), joinInts(res.Undecodable, ", "))
	}
	if res.Republished == 0 && len(res.Undecodable) == 0 {
		fmt.Fprintf(e.stdout, "nothing matched: check the selection with `wmonce outbox rejected -relay %s`\n", shellQuote(relay))
	}
}

func (e *env) outboxForget(ctx context.Context, args []string) error {
	fs := e.flags("outbox forget")
	relay := fs.String("relay", "", "name of the retired relay (its RelayConfig.Name; required)")
	dryRun := fs.Bool("dry-run", false, "show what would be forgotten, change nothing")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if strings.TrimSpace(*relay) == "" {
		return usagef("-relay is required: the name of the retired relay (`wmonce outbox` lists the relays)")
	}
	if err := checkInput(operate.CheckConsumer("-relay", *relay)); err != nil {
		return err
	}
	db, err := e.openMigrated(ctx)
	if err != nil {
		return err
	}
	res, err := operate.ForgetRelay(ctx, db, e.g.schema, operate.ForgetRequest{Relay: *relay, DryRun: *dryRun})
	if err != nil { // outbox.ErrRelayActive says to stop the relay first
		return e.explain(err)
	}
	if e.g.json {
		return e.printJSON(res)
	}
	what := fmt.Sprintf("relay %q (source %q): %d row(s) it had not forwarded", *relay, res.Stats.Source, res.Backlog)
	for _, h := range res.Held {
		what += fmt.Sprintf("; held topic %s, %d row(s)", h.Topic, h.Rows)
	}
	if *dryRun {
		fmt.Fprintf(e.stdout, "dry run: would forget %s; run again without -dry-run to forget it\n", what)
		return nil
	}
	fmt.Fprintf(e.stdout, "forgot %s; it no longer holds back outbox cleanup\n", what)
	if res.Backlog > 0 {
		fmt.Fprintf(e.stdout, "no relay of that name forwards those rows any more; one started later under that name begins again at the oldest row in the outbox\n")
	}
	return nil
}
