package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/operate"
)

func inboxCommand() *command {
	return &command{
		name:    "inbox",
		summary: "look at and act on inbox rows: stats, list, inspect, replay, skip, unpark",
		usage: `
inbox stats
inbox list -consumer C [-status S[,S]] [-key K] [-message M] [-topic T] [-error TEXT] [-after ID] [-limit N]
inbox inspect ID
inbox inspect -consumer C -message M
inbox replay -consumer C [-status FAILED] [-id ID[,ID]] [-message M] [-key K] [-topic T] [-error TEXT] [-dry-run]
inbox skip -consumer C (-id ID | -message M | -key K | -topic T | -error TEXT | -all) -reason R [-status FAILED] [-dry-run]
inbox unpark -consumer C -key K [-dry-run]`,
		details: `
stats    rows per consumer and status, and the age of the oldest PENDING row.
list     rows in received order, 50 at a time; page on with -after (the last ID shown).
inspect  one row with its payload and metadata.
replay   sends matching rows (default: FAILED) back to PENDING with the attempt count reset;
         their handler runs again, once. -status DONE replays applied rows: their effects are
         applied a second time. -dry-run only counts.
skip     marks matching FAILED (or -status PENDING) rows SKIPPED with the reason: they will
         not run, their ordering key moves on, and they stay as dedupe records. Name the rows
         (or say -all for every matching row of the consumer).
unpark   replays the FAILED rows of one ordering key; the key's later rows follow them.
Rows IN_PROGRESS belong to a worker and are never changed. -message may be repeated.`,
		examples: []string{
			"wmonce inbox stats",
			"wmonce inbox list -consumer rewards -status FAILED",
			"wmonce inbox inspect 1234",
			"wmonce inbox inspect -consumer rewards -message 0d6f8c1e-6a43-4c1f-9a0e-2d1c5b7f9e10",
			"wmonce inbox replay -consumer rewards -dry-run",
			"wmonce inbox replay -consumer rewards -error 'connection refused'",
			"wmonce inbox skip -consumer rewards -key order-42 -reason 'refunded by hand, ticket 881'",
			"wmonce inbox unpark -consumer rewards -key order-42",
		},
		actions: []action{
			{name: "stats", db: (*env).openMigrated, new: report(operate.ReadInbox, (*env).printInboxStatsOrEmpty)},
			{name: "list", db: (*env).openMigrated, new: newInboxList},
			{name: "inspect", args: true, db: (*env).openMigrated, new: newInboxInspect},
			{name: "replay", db: (*env).openMigrated, new: newInboxChange("replay")},
			{name: "skip", db: (*env).openMigrated, new: newInboxChange("skip")},
			{name: "unpark", db: (*env).openMigrated, new: newInboxChange("unpark")},
		},
	}
}

// ops are the inbox's operations on the database the action opened.
func (e *env) ops() (*inbox.Ops, error) {
	return inbox.NewOps(e.db, inbox.OpsConfig{Schema: e.g.schema}, nil)
}

func (e *env) printInboxStatsOrEmpty(st []operate.InboxStats) {
	if len(st) == 0 {
		fmt.Fprintln(e.stdout, "the inbox is empty")
		return
	}
	e.printInboxStats(st)
}

// filterFlags registers the row selectors shared by list, replay and skip.
type filterFlags struct {
	consumer, key, topic, errorText *string
	statuses, ids, messages         *listFlag
}

func addFilterFlags(fs *flag.FlagSet) filterFlags {
	f := filterFlags{
		consumer:  fs.String("consumer", "", "consumer name (required)"),
		key:       fs.String("key", "", "ordering key"),
		topic:     fs.String("topic", "", "topic the rows were received from"),
		errorText: fs.String("error", "", "text the last error contains"),
		statuses:  &listFlag{split: true},
		ids:       &listFlag{split: true},
		messages:  &listFlag{},
	}
	fs.Var(f.statuses, "status", "statuses, comma-separated: PENDING, IN_PROGRESS, DONE, FAILED, SKIPPED")
	fs.Var(f.ids, "id", "row ids, comma-separated or repeated")
	fs.Var(f.messages, "message", "message id (dedupe key); repeat for several")
	return f
}

// filter is the inbox.Filter the flags select, checked by the API's input rules.
func (f filterFlags) filter() (inbox.Filter, error) {
	statuses, serr := operate.ParseStatuses(f.statuses.values)
	ids, ierr := parseIDs(f.ids.values, "-id", "inbox row ids")
	return inbox.Filter{
			Consumer: *f.consumer, Statuses: statuses, IDs: ids, MessageIDs: f.messages.values,
			OrderingKey: *f.key, Topic: *f.topic, ErrorContains: *f.errorText,
		}, operate.FirstError(
			required(*f.consumer, "-consumer is required (`wmonce inbox stats` lists the consumers)"),
			checkInput(operate.CheckConsumer("-consumer", *f.consumer), operate.CheckText("-key", *f.key), operate.CheckText("-topic", *f.topic),
				operate.CheckText("-error", *f.errorText), operate.CheckText("-message", f.messages.values...)),
			serr, ierr)
}

// inboxList is `wmonce inbox list`.
type inboxList struct {
	flags filterFlags
	after int64
	limit int
	f     inbox.Filter
}

func newInboxList(fs *flag.FlagSet) runner {
	l := &inboxList{flags: addFilterFlags(fs)}
	fs.Int64Var(&l.after, "after", 0, "show rows after this id (paging)")
	fs.IntVar(&l.limit, "limit", 50, "rows to show (1-"+strconv.Itoa(inbox.MaxBatchSize)+")")
	return l
}

func (l *inboxList) check([]string) (err error) {
	l.f, err = l.flags.filter()
	l.f.AfterID = l.after
	return operate.FirstError(err,
		usageIf(l.limit < 1 || l.limit > inbox.MaxBatchSize, "-limit must be between 1 and %d", inbox.MaxBatchSize),
		usageIf(l.after < 0, "-after must be a row id"))
}

func (l *inboxList) run(ctx context.Context, e *env) error {
	ops, err := e.ops()
	if err != nil {
		return err
	}
	rows, err := ops.List(ctx, l.f, l.limit)
	if err != nil {
		return err
	}
	out := make([]operate.InboxRow, len(rows))
	for i, r := range rows {
		out[i] = operate.NewInboxRow(r, false)
	}
	return show(e, out, l.print(e))
}

// print prints the rows as a table, and how to page on after a full page.
func (l *inboxList) print(e *env) func([]operate.InboxRow) {
	return func(rows []operate.InboxRow) {
		if len(rows) == 0 {
			fmt.Fprintf(e.stdout, "no rows of %q match\n", l.f.Consumer)
			return
		}
		tw := e.table()
		fmt.Fprintf(tw, "ID\tMESSAGE\tKEY\tSTATUS\tATTEMPTS\tRECEIVED\tLAST ERROR\n")
		for _, r := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, truncate(r.MessageID, 40), orDash(truncate(r.OrderingKey, 24)), r.Status, r.Attempts,
				r.ReceivedAt.Local().Format("2006-01-02 15:04:05"), orDash(truncate(r.LastError, 60)))
		}
		_ = tw.Flush()
		if len(rows) == l.limit {
			fmt.Fprintf(e.stdout, "more rows may follow: add -after %d\n", rows[len(rows)-1].ID)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// inboxInspect is `wmonce inbox inspect`: a row by id, or by consumer and message.
type inboxInspect struct {
	consumer, message string
	id                int64
}

func newInboxInspect(fs *flag.FlagSet) runner {
	i := &inboxInspect{}
	fs.StringVar(&i.consumer, "consumer", "", "consumer name (with -message)")
	fs.StringVar(&i.message, "message", "", "message id (dedupe key)")
	return i
}

// check reads the row id inspect was given, or checks -consumer and -message.
func (i *inboxInspect) check(rest []string) error {
	switch {
	case len(rest) == 1 && i.consumer == "" && i.message == "":
		var err error
		i.id, err = strconv.ParseInt(rest[0], 10, 64)
		return usageIf(err != nil || i.id < 1, "the row id must be a positive integer, got %q", rest[0])
	case len(rest) == 0 && i.consumer != "" && i.message != "":
		return checkInput(operate.CheckConsumer("-consumer", i.consumer), operate.CheckText("-message", i.message))
	default:
		return usagef("give a row id, or -consumer and -message")
	}
}

func (i *inboxInspect) run(ctx context.Context, e *env) error {
	ops, err := e.ops()
	if err != nil {
		return err
	}
	row, err := i.read(ctx, ops)
	if errors.Is(err, inbox.ErrNotFound) {
		return fmt.Errorf("%w (`wmonce inbox list -consumer C` shows the rows; `wmonce dedupe` also looks in the claims)", err)
	}
	if err != nil {
		return err
	}
	return show(e, operate.NewInboxRow(row, true), e.printInboxRow)
}

// read reads the row by id, or by consumer and message.
func (i *inboxInspect) read(ctx context.Context, ops *inbox.Ops) (inbox.Row, error) {
	if i.id > 0 {
		return ops.Inspect(ctx, i.id)
	}
	return ops.InspectMessage(ctx, i.consumer, i.message)
}

// printInboxRow prints one inbox row as a table of fields, then its payload.
func (e *env) printInboxRow(r operate.InboxRow) {
	w := e.table()
	fmt.Fprintf(w, "id\t%d\n", r.ID)
	fmt.Fprintf(w, "consumer\t%s\n", r.Consumer)
	fmt.Fprintf(w, "message id\t%s\n", r.MessageID)
	fmt.Fprintf(w, "message uuid\t%s\n", r.MessageUUID)
	fmt.Fprintf(w, "ordering key\t%s\n", orDash(r.OrderingKey))
	fmt.Fprintf(w, "topic\t%s\n", orDash(r.Topic))
	fmt.Fprintf(w, "status\t%s\n", r.Status)
	fmt.Fprintf(w, "attempts\t%d\n", r.Attempts)
	fmt.Fprintf(w, "received\t%s\n", when(r.ReceivedAt))
	fmt.Fprintf(w, "next attempt\t%s\n", when(r.NextAttemptAt))
	if r.LeaseUntil != nil {
		fmt.Fprintf(w, "lease until\t%s\n", when(*r.LeaseUntil))
	}
	if r.FinishedAt != nil {
		fmt.Fprintf(w, "finished\t%s\n", when(*r.FinishedAt))
	}
	fmt.Fprintf(w, "last error\t%s\n", orDash(r.LastError))
	for _, k := range sortedKeys(r.Metadata) {
		fmt.Fprintf(w, "metadata %s\t%s\n", k, r.Metadata[k])
	}
	_ = w.Flush()
	if r.Payload != nil {
		fmt.Fprintf(e.stdout, "payload (%d bytes):\n%s\n", r.PayloadSize, *r.Payload)
	} else {
		fmt.Fprintf(e.stdout, "payload (%d bytes, not UTF-8, base64):\n%s\n", r.PayloadSize, *r.PayloadBase64)
	}
}

// inboxChanges are the inbox changes: what each checks beyond the filter, how it runs, and
// what it reports done. An unpark is a replay of one key's FAILED rows: its dry run counts
// what that replay would change.
var inboxChanges = map[string]struct {
	check func(f inbox.Filter, c *inboxChange) error
	run   func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c *inboxChange) (int, error)
	done  string // format of the report: rows, statuses, consumer
}{
	"replay": {
		check: func(f inbox.Filter, _ *inboxChange) error { return operate.CheckChange("replay", f) },
		run: func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c *inboxChange) (int, error) {
			return ops.Replay(ctx, f, c.dryRun)
		},
		done: "replayed %d %s row(s) of %q: they are PENDING and run again on the next claim\n",
	},
	"skip": {
		check: checkSkip,
		run: func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c *inboxChange) (int, error) {
			return ops.Skip(ctx, f, c.reason, c.dryRun)
		},
		done: "skipped %d %s row(s) of %q\n",
	},
	"unpark": {
		check: checkUnpark,
		run: func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c *inboxChange) (int, error) {
			if c.dryRun {
				return ops.Replay(ctx, f, true)
			}
			return ops.UnparkKey(ctx, f.Consumer, f.OrderingKey)
		},
		done: "replayed %d %s row(s) of %q: they are PENDING and run again on the next claim\n",
	},
}

// inboxChange is `wmonce inbox replay`, `skip` or `unpark`.
type inboxChange struct {
	action      string
	flags       filterFlags
	dryRun, all bool
	reason      string
	f           inbox.Filter
}

func newInboxChange(action string) func(*flag.FlagSet) runner {
	return func(fs *flag.FlagSet) runner {
		c := &inboxChange{action: action, flags: addFilterFlags(fs)}
		fs.BoolVar(&c.dryRun, "dry-run", false, "count the rows that would change, change nothing")
		if action == "skip" {
			fs.StringVar(&c.reason, "reason", "", "why the rows are skipped (kept in last_error; required)")
			fs.BoolVar(&c.all, "all", false, "skip every matching row of the consumer when no other selector is given")
		}
		return c
	}
}

func (c *inboxChange) check([]string) (err error) {
	if c.f, err = c.flags.filter(); err != nil {
		return err
	}
	return inboxChanges[c.action].check(c.f, c)
}

// checkSkip is the inbox's rule for skip, a reason, and rows named (or -all).
func checkSkip(f inbox.Filter, c *inboxChange) error {
	return operate.FirstError(
		required(c.reason, "-reason is required: it is kept with the skipped rows"),
		checkInput(operate.CheckText("-reason", c.reason)),
		operate.CheckChange("skip", f),
		usageIf(!c.all && !operate.Narrowed(f), "name the rows to skip with -id, -message, -key, -topic or -error, or give -all to skip every matching row of %q", f.Consumer))
}

func checkUnpark(f inbox.Filter, _ *inboxChange) error {
	return operate.FirstError(
		usageIf(f.OrderingKey == "", "-key is required: unpark replays the FAILED rows of one ordering key"),
		usageIf(len(f.Statuses) > 0 || len(f.IDs) > 0 || len(f.MessageIDs) > 0 || f.Topic != "" || f.ErrorContains != "",
			"unpark takes only -consumer and -key; use replay for other selections"))
}

func (c *inboxChange) run(ctx context.Context, e *env) error {
	ops, err := e.ops()
	if err != nil {
		return err
	}
	n, err := inboxChanges[c.action].run(ctx, ops, c.f, c)
	if err != nil {
		return err
	}
	return show(e, operate.ChangeResponse{Action: c.action, Consumer: c.f.Consumer, DryRun: c.dryRun, Rows: n}, c.print(e))
}

// print says how many rows the change changed, or on a dry run would change.
func (c *inboxChange) print(e *env) func(operate.ChangeResponse) {
	return func(r operate.ChangeResponse) {
		statuses := "FAILED"
		if len(c.f.Statuses) > 0 {
			statuses = joinStatuses(c.f.Statuses, "/")
		}
		if c.dryRun {
			fmt.Fprintf(e.stdout, "dry run: %s would change %d %s row(s) of %q; run again without -dry-run to do it\n", c.action, r.Rows, statuses, r.Consumer)
			return
		}
		fmt.Fprintf(e.stdout, inboxChanges[c.action].done, r.Rows, statuses, r.Consumer)
		if r.Rows == 0 {
			fmt.Fprintf(e.stdout, "nothing matched: check the selectors with `wmonce inbox list -consumer %s`\n", shellQuote(r.Consumer))
		}
	}
}

func joinStatuses(ss []inbox.Status, sep string) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, sep)
}

// checkInput turns the first failed input rule (shared with the admin API) into a usage error.
func checkInput(errs ...error) error {
	if err := operate.FirstError(errs...); err != nil {
		return usagef("%v", err)
	}
	return nil
}
