package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/wmonce/watermill-once/internal/operate"
)

func failuresCommand() *command {
	return &command{
		name:    "failures",
		summary: "failure groups: parked inbox rows, poison-queue messages, rejected outbox rows by error; replay, skip, discard",
		usage: `
failures [list] [-max-rows N]
failures replay FINGERPRINT [-id N[,N]] [-dry-run]
failures skip FINGERPRINT -reason TEXT [-id N[,N]] [-dry-run]
failures discard FINGERPRINT [-id N[,N]] [-dry-run]`,
		details: `
list     FAILED (parked) inbox rows, messages the poison queue parked (ParkingPublisher) and
         rejected outbox rows, grouped by where they failed (the inbox consumer, the handler
         or the relay, and the topic) and by their error with UUIDs, addresses, hex ids
         (0x..., digests, runs holding a digit and a letter a-f) and decimal numbers of any
         length replaced (<uuid>, <addr>, <hex>, <n>): one poison storm is one group. The largest first, with its fingerprint, rows, first and last seen.
replay   an inbox group's rows run again (PENDING, attempts reset); a parked group's messages
         are stored in the outbox again for the topic they were consumed from, once; a
         rejected group's rows are stored in the outbox again and forwarded. Fix the cause
         first.
skip     an inbox group's rows are marked SKIPPED with the reason: they do not run, their
         ordering keys move on, and they stay as dedupe records.
discard  a parked group is set aside (never replayed; the copies stay in the poison topic);
         a rejected group's rows are deleted from outbox_rejected (the only copy of those
         messages). Inbox rows are never discarded: skip them.
-dry-run lists exactly the rows (inbox ids or outbox offsets) the action would touch; pass
         them with -id to touch exactly those, and not rows that joined the group since.
An action prints the rows its own transaction changed: of concurrent replays of one group,
one reports the rows and the others none. A group with no row to act on (an unknown
fingerprint, or rows another action took first) is an error, exit 1, as the admin API
answers it 404.`,
		examples: []string{
			"wmonce failures",
			"wmonce failures replay 3f9c0a1b2c3d4e5f -dry-run",
			"wmonce failures replay 3f9c0a1b2c3d4e5f -id 812,813,815",
			"wmonce failures skip 3f9c0a1b2c3d4e5f -reason 'refunded by hand, ticket 4411'",
			"wmonce -json failures",
		},
		actions: []action{
			{name: "list", db: (*env).openMigrated, new: newFailuresList},
			{name: "replay", args: true, db: (*env).openMigrated, new: newFailuresAct(operate.ActionReplay)},
			{name: "skip", args: true, db: (*env).openMigrated, new: newFailuresAct(operate.ActionSkip)},
			{name: "discard", args: true, db: (*env).openMigrated, new: newFailuresAct(operate.ActionDiscard)},
		},
	}
}

// failuresList is `wmonce failures list`.
type failuresList struct{ maxRows int }

func newFailuresList(fs *flag.FlagSet) runner {
	l := &failuresList{}
	fs.IntVar(&l.maxRows, "max-rows", operate.DefaultFailureGroupRows, "group the newest N rows of each kind (0: every row; the patterns cost about a second per 10,000 distinct errors)")
	return l
}

func (l *failuresList) check([]string) error {
	return usageIf(l.maxRows < 0, "-max-rows must not be negative (0: every row)")
}

func (l *failuresList) run(ctx context.Context, e *env) error {
	resp, err := operate.ReadFailureGroups(ctx, e.db, e.g.schema, l.maxRows)
	if err != nil {
		return err
	}
	return show(e, resp, e.printFailureGroups)
}

// printFailureGroups prints the groups as a table, and the rows left out.
func (e *env) printFailureGroups(resp operate.FailureGroupsResponse) {
	if len(resp.Groups) == 0 {
		fmt.Fprintln(e.stdout, "no failure groups: no FAILED inbox rows, parked messages or rejected outbox rows")
		return
	}
	tw := e.table()
	fmt.Fprintf(tw, "FINGERPRINT\tKIND\tCONSUMER/RELAY\tTOPIC\tROWS\tFIRST SEEN\tLAST SEEN\tACTIONS\tERROR\n")
	for _, g := range resp.Groups {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", g.Fingerprint, g.Kind, orDash(g.Consumer+g.Handler+g.Relay), orDash(truncate(g.Topic, 32)), g.Rows,
			when(g.FirstSeen), when(g.LastSeen), strings.Join(g.Actions, ","), truncate(g.Pattern, 70))
	}
	_ = tw.Flush()
	if resp.LeftOut > 0 {
		fmt.Fprintf(e.stdout, "%d older row(s) are not grouped (only the newest %d of each kind): add -max-rows 0 to group every row\n", resp.LeftOut, resp.MaxRows)
	}
}

// failuresAct is `wmonce failures replay|skip|discard FINGERPRINT`.
type failuresAct struct {
	req operate.FailureActionRequest
	ids listFlag
}

func newFailuresAct(action string) func(*flag.FlagSet) runner {
	return func(fs *flag.FlagSet) runner {
		a := &failuresAct{req: operate.FailureActionRequest{Action: action}, ids: listFlag{split: true}}
		fs.Var(&a.ids, "id", "only these rows of the group: inbox row ids or outbox offsets, as a dry run lists them (repeat or comma-separate)")
		fs.BoolVar(&a.req.DryRun, "dry-run", false, "list the rows the action would touch, change nothing")
		if action == operate.ActionSkip {
			fs.StringVar(&a.req.Reason, "reason", "", "why the rows are skipped (kept in last_error; required)")
		}
		return a
	}
}

func (a *failuresAct) check(rest []string) (err error) {
	if len(rest) != 1 {
		return usagef("give the group's fingerprint (`wmonce failures` lists them)")
	}
	a.req.Fingerprint = rest[0]
	a.req.IDs, err = parseIDs(a.ids.values, "-id", "inbox row ids or outbox offsets")
	return err
}

func (a *failuresAct) run(ctx context.Context, e *env) error {
	// One answer with the API's (404): a group without rows to act on, unknown or emptied by
	// someone else before or during this action, is an error, never "0 rows done".
	group, err := operate.FindFailureGroup(ctx, e.db, e.g.schema, a.req.Fingerprint, a.req.IDs)
	if err == nil {
		a.req.Kind, a.req.Fingerprint = group.Kind, group.Fingerprint
		var res operate.FailureActionResponse
		if res, err = operate.ActOnFailureGroup(ctx, e.db, e.g.schema, a.req); err == nil {
			return show(e, res, func(res operate.FailureActionResponse) { e.printFailureAction(group, a.req, res) })
		}
	}
	if errors.Is(err, operate.ErrNoFailureGroup) {
		return fmt.Errorf("%w: `wmonce failures` lists the groups", err)
	}
	return err
}

// failureRows names, for each kind, the rows an action reports and what their ids are.
var failureRows = map[string]struct {
	what   func(operate.FailureGroup) string
	idName string
}{
	operate.FailureKindInbox:    {func(g operate.FailureGroup) string { return "inbox row(s) of consumer " + g.Consumer }, "ids"},
	operate.FailureKindParked:   {func(g operate.FailureGroup) string { return "parked message(s) of handler " + orDash(g.Handler) }, "offsets"},
	operate.FailureKindRejected: {func(g operate.FailureGroup) string { return "rejected outbox row(s) of relay " + g.Relay }, "offsets"},
}

var pastTense = map[string]string{operate.ActionReplay: "replayed", operate.ActionSkip: "skipped", operate.ActionDiscard: "discarded"}

func (e *env) printFailureAction(group operate.FailureGroup, req operate.FailureActionRequest, res operate.FailureActionResponse) {
	rows := failureRows[group.Kind]
	what, list := rows.what(group), joinInts(res.IDs, ",")
	if len(res.Undecodable) > 0 {
		defer fmt.Fprintf(e.stdout, "left in the group, cannot be replayed: offsets %s\n", joinInts(res.Undecodable, ","))
	}
	if !req.DryRun {
		fmt.Fprintf(e.stdout, "%s: %d %s (%s %s)\n", pastTense[req.Action], res.Rows, what, rows.idName, orDash(list))
		return
	}
	fmt.Fprintf(e.stdout, "dry run: %s would %s %d %s (%s %s); nothing changed\n", req.Fingerprint, req.Action, res.Rows, what, rows.idName, orDash(list))
	if res.Rows > 0 {
		fmt.Fprintf(e.stdout, "to touch exactly these: wmonce failures %s %s -id %s%s\n", req.Action, req.Fingerprint, list, reasonFlag(req.Action, req.Reason))
	}
}

func reasonFlag(action, reason string) string {
	if action != operate.ActionSkip {
		return ""
	}
	if reason == "" {
		reason = "..."
	}
	return " -reason " + shellQuote(reason)
}
