package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
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
			{name: "stats", run: (*env).inboxStats},
			{name: "list", run: (*env).inboxList},
			{name: "inspect", run: (*env).inboxInspect},
			{name: "replay", run: inboxChange("replay")},
			{name: "skip", run: inboxChange("skip")},
			{name: "unpark", run: inboxChange("unpark")},
		},
	}
}

// inboxChange is the action of one inbox change (replay, skip, unpark).
func inboxChange(op string) func(*env, context.Context, []string) error {
	return func(e *env, ctx context.Context, args []string) error { return e.inboxChange(ctx, op, args) }
}

func (e *env) ops(ctx context.Context) (*inbox.Ops, error) {
	db, err := e.openMigrated(ctx)
	if err != nil {
		return nil, err
	}
	return inbox.NewOps(db, inbox.OpsConfig{Schema: e.g.schema}, nil)
}

func (e *env) inboxStats(ctx context.Context, args []string) error {
	return readAndShow(ctx, e, "inbox stats", args, operate.ReadInbox, func(st []operate.InboxStats) {
		if len(st) == 0 {
			fmt.Fprintln(e.stdout, "the inbox is empty")
			return
		}
		e.printInboxStats(st)
	})
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

func (f filterFlags) filter() (inbox.Filter, error) {
	if strings.TrimSpace(*f.consumer) == "" {
		return inbox.Filter{}, usagef("-consumer is required (`wmonce inbox stats` lists the consumers)")
	}
	if err := checkInput(
		operate.CheckConsumer("-consumer", *f.consumer), operate.CheckText("-key", *f.key), operate.CheckText("-topic", *f.topic),
		operate.CheckText("-error", *f.errorText), operate.CheckText("-message", f.messages.values...)); err != nil {
		return inbox.Filter{}, err
	}
	out := inbox.Filter{Consumer: *f.consumer, OrderingKey: *f.key, Topic: *f.topic, ErrorContains: *f.errorText, MessageIDs: f.messages.values}
	for _, s := range f.statuses.values {
		st, err := operate.ParseStatus(s)
		if err != nil {
			return inbox.Filter{}, usagef("-status: %v", err)
		}
		out.Statuses = append(out.Statuses, st)
	}
	ids, err := parseIDs(f.ids.values, "inbox row ids")
	if err != nil {
		return inbox.Filter{}, err
	}
	out.IDs = ids
	return out, nil
}

func (e *env) inboxList(ctx context.Context, args []string) error {
	fs := e.flags("inbox list")
	ff := addFilterFlags(fs)
	after := fs.Int64("after", 0, "show rows after this id (paging)")
	limit := fs.Int("limit", 50, "rows to show (1-"+strconv.Itoa(inbox.MaxBatchSize)+")")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	f, err := ff.filter()
	if err != nil {
		return err
	}
	if *limit < 1 || *limit > inbox.MaxBatchSize {
		return usagef("-limit must be between 1 and %d", inbox.MaxBatchSize)
	}
	if *after < 0 {
		return usagef("-after must be a row id")
	}
	f.AfterID = *after
	ops, err := e.ops(ctx)
	if err != nil {
		return err
	}
	rows, err := ops.List(ctx, f, *limit)
	if err != nil {
		return e.explain(err)
	}
	if e.g.json {
		out := make([]operate.InboxRow, len(rows))
		for i, r := range rows {
			out[i] = operate.NewInboxRow(r, false)
		}
		return e.printJSON(out)
	}
	if len(rows) == 0 {
		fmt.Fprintf(e.stdout, "no rows of %q match\n", f.Consumer)
		return nil
	}
	tw := e.table()
	fmt.Fprintf(tw, "ID\tMESSAGE\tKEY\tSTATUS\tATTEMPTS\tRECEIVED\tLAST ERROR\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, truncate(r.MessageID, 40), orDash(truncate(r.OrderingKey, 24)), r.Status, r.Attempts,
			r.ReceivedAt.Local().Format("2006-01-02 15:04:05"), orDash(truncate(r.LastError, 60)))
	}
	_ = tw.Flush()
	if len(rows) == *limit {
		fmt.Fprintf(e.stdout, "more rows may follow: add -after %d\n", rows[len(rows)-1].ID)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (e *env) inboxInspect(ctx context.Context, args []string) error {
	fs := e.flags("inbox inspect")
	consumer := fs.String("consumer", "", "consumer name (with -message)")
	message := fs.String("message", "", "message id (dedupe key)")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	id, err := inspectTarget(rest, *consumer, *message)
	if err != nil {
		return err
	}
	ops, err := e.ops(ctx)
	if err != nil {
		return err
	}
	var row inbox.Row
	if id > 0 {
		row, err = ops.Inspect(ctx, id)
	} else {
		row, err = ops.InspectMessage(ctx, *consumer, *message)
	}
	if errors.Is(err, inbox.ErrNotFound) {
		return fmt.Errorf("%w (`wmonce inbox list -consumer C` shows the rows; `wmonce dedupe` also looks in the claims)", err)
	}
	if err != nil {
		return e.explain(err)
	}
	r := operate.NewInboxRow(row, true)
	if e.g.json {
		return e.printJSON(r)
	}
	e.printInboxRow(r)
	return nil
}

// inspectTarget is the row id `inbox inspect` was given, or 0 when it was given -consumer and
// -message (checked); a usage error for anything else.
func inspectTarget(rest []string, consumer, message string) (int64, error) {
	switch {
	case len(rest) == 1 && consumer == "" && message == "":
		id, err := strconv.ParseInt(rest[0], 10, 64)
		if err != nil || id < 1 {
			return 0, usagef("the row id must be a positive integer, got %q", rest[0])
		}
		return id, nil
	case len(rest) == 0 && consumer != "" && message != "":
		return 0, checkInput(operate.CheckConsumer("-consumer", consumer), operate.CheckText("-message", message))
	default:
		return 0, usagef("give a row id, or -consumer and -message")
	}
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
// what it reports done. An unpark's dry run counts what a replay of the key would change.
var inboxChanges = map[string]struct {
	check func(f inbox.Filter, c changeFlags) error
	run   func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c changeFlags) (int, error)
	done  string // format of the report: rows, statuses, consumer
}{
	"replay": {
		check: func(inbox.Filter, changeFlags) error { return nil },
		run: func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c changeFlags) (int, error) {
			return ops.Replay(ctx, f, c.dryRun)
		},
		done: "replayed %d %s row(s) of %q: they are PENDING and run again on the next claim\n",
	},
	"skip": {
		check: checkSkip,
		run: func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c changeFlags) (int, error) {
			return ops.Skip(ctx, f, c.reason, c.dryRun)
		},
		done: "skipped %d %s row(s) of %q\n",
	},
	"unpark": {
		check: checkUnpark,
		run: func(ctx context.Context, ops *inbox.Ops, f inbox.Filter, c changeFlags) (int, error) {
			if c.dryRun {
				return ops.Replay(ctx, f, true)
			}
			return ops.UnparkKey(ctx, f.Consumer, f.OrderingKey)
		},
		done: "replayed %d %s row(s) of %q: they are PENDING and run again on the next claim\n",
	},
}

// changeFlags are the flags of an inbox change besides the filter's.
type changeFlags struct {
	dryRun, all bool
	reason      string
}

func checkSkip(f inbox.Filter, c changeFlags) error {
	if strings.TrimSpace(c.reason) == "" {
		return usagef("-reason is required: it is kept with the skipped rows")
	}
	if err := checkInput(operate.CheckText("-reason", c.reason)); err != nil {
		return err
	}
	if !c.all && len(f.IDs) == 0 && len(f.MessageIDs) == 0 && f.OrderingKey == "" && f.Topic == "" && f.ErrorContains == "" {
		return usagef("name the rows to skip with -id, -message, -key, -topic or -error, or give -all to skip every matching row of %q", f.Consumer)
	}
	return nil
}

func checkUnpark(f inbox.Filter, _ changeFlags) error {
	if f.OrderingKey == "" {
		return usagef("-key is required: unpark replays the FAILED rows of one ordering key")
	}
	if len(f.Statuses) > 0 || len(f.IDs) > 0 || len(f.MessageIDs) > 0 || f.Topic != "" || f.ErrorContains != "" {
		return usagef("unpark takes only -consumer and -key; use replay for other selections")
	}
	return nil
}

func (e *env) inboxChange(ctx context.Context, action string, args []string) error {
	fs := e.flags("inbox " + action)
	ff := addFilterFlags(fs)
	var c changeFlags
	fs.BoolVar(&c.dryRun, "dry-run", false, "count the rows that would change, change nothing")
	if action == "skip" {
		fs.StringVar(&c.reason, "reason", "", "why the rows are skipped (kept in last_error; required)")
		fs.BoolVar(&c.all, "all", false, "skip every matching row of the consumer when no other selector is given")
	}
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	f, err := ff.filter()
	if err != nil {
		return err
	}
	if slices.Contains(f.Statuses, inbox.StatusInProgress) {
		return usagef("IN_PROGRESS rows belong to a worker and cannot be changed: wait for it, or its lease, to settle them")
	}
	change := inboxChanges[action]
	if err := change.check(f, c); err != nil {
		return err
	}
	ops, err := e.ops(ctx)
	if err != nil {
		return err
	}
	n, err := change.run(ctx, ops, f, c)
	if err != nil {
		return e.explain(err)
	}
	if e.g.json {
		return e.printJSON(operate.ChangeResponse{Action: action, Consumer: f.Consumer, DryRun: c.dryRun, Rows: n})
	}
	statuses := "FAILED"
	if len(f.Statuses) > 0 {
		statuses = joinStatuses(f.Statuses, "/")
	}
	if c.dryRun {
		fmt.Fprintf(e.stdout, "dry run: %s would change %d %s row(s) of %q; run again without -dry-run to do it\n", action, n, statuses, f.Consumer)
		return nil
	}
	fmt.Fprintf(e.stdout, change.done, n, statuses, f.Consumer)
	if n == 0 {
		fmt.Fprintf(e.stdout, "nothing matched: check the selectors with `wmonce inbox list -consumer %s`\n", shellQuote(f.Consumer))
	}
	return nil
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
	for _, err := range errs {
		if err != nil {
			return usagef("%v", err)
		}
	}
	return nil
}
