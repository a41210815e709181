package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/operate"
)

// wmonce pause / resume: an inbox consumer (inbox.Ops.Pause) or a relay (outbox.PauseRelay).

func pauseCommand() *command {
	return &command{
		name:    "pause",
		summary: "pause an inbox consumer or a relay: stored in the database, honoured by every process",
		usage: `
pause -consumer C
pause -relay R`,
		details: `
-consumer  no Processor of inbox consumer C, in any process, claims a row from the moment the
           pause commits (attempts running then finish); the Receiver goes on storing and
           acking messages, which wait as PENDING.
-relay     no instance of relay R publishes anything more: rows wait in the outbox and are
           published, in order, after the resume. Every instance sees it within one
           PollInterval, at once while it LISTENs.
A pause outlives restarts until ` + "`wmonce resume`" + `. ` + "`wmonce status`" + ` shows it.`,
		examples: []string{"wmonce pause -consumer billing", "wmonce pause -relay kafka"},
		actions:  []action{{db: (*env).openMigrated, new: newSetPaused(true)}},
	}
}

func resumeCommand() *command {
	return &command{
		name:     "resume",
		summary:  "resume a paused inbox consumer or relay",
		usage:    "\nresume -consumer C\nresume -relay R",
		details:  "\nUndoes `wmonce pause`: the consumer's processors claim again, the relay goes on from its\nposition, at once where they LISTEN, otherwise within their PollInterval.",
		examples: []string{"wmonce resume -consumer billing", "wmonce resume -relay kafka"},
		actions:  []action{{db: (*env).openMigrated, new: newSetPaused(false)}},
	}
}

// setPaused is `wmonce pause` or `wmonce resume`.
type setPaused struct{ req operate.PauseRequest }

func newSetPaused(pause bool) func(*flag.FlagSet) runner {
	return func(fs *flag.FlagSet) runner {
		p := &setPaused{req: operate.PauseRequest{Pause: pause}}
		fs.StringVar(&p.req.Consumer, "consumer", "", "the inbox consumer (its ReceiverConfig.Consumer)")
		fs.StringVar(&p.req.Relay, "relay", "", "the relay (its RelayConfig.Name)")
		return p
	}
}

func (p *setPaused) check([]string) error {
	return operate.FirstError(
		usageIf((strings.TrimSpace(p.req.Consumer) == "") == (strings.TrimSpace(p.req.Relay) == ""), "give -consumer or -relay (one of them): `wmonce status` lists both"),
		checkInput(operate.CheckConsumer("-consumer", p.req.Consumer), operate.CheckConsumer("-relay", p.req.Relay)))
}

func (p *setPaused) run(ctx context.Context, e *env) error {
	ops, err := e.ops()
	if err != nil {
		return err
	}
	res, err := operate.SetPaused(ctx, e.db, e.g.schema, ops, p.req) // outbox.ErrRelayNotFound: a relay registers its name when it first runs
	if err != nil {
		return err
	}
	return show(e, res, e.printPaused)
}

// printPaused says what pause or resume did.
func (e *env) printPaused(res operate.PauseResponse) {
	what := fmt.Sprintf("relay %q", res.Relay)
	if res.Consumer != "" {
		what = fmt.Sprintf("inbox consumer %q", res.Consumer)
	}
	switch {
	case res.Paused && res.Changed:
		fmt.Fprintf(e.stdout, "paused %s; `wmonce resume` undoes it\n", what)
	case res.Paused:
		fmt.Fprintf(e.stdout, "%s was paused already\n", what)
	case res.Changed:
		fmt.Fprintf(e.stdout, "resumed %s\n", what)
	default:
		fmt.Fprintf(e.stdout, "%s was not paused\n", what)
	}
}

// printInboxPauses adds the paused consumers to the inbox stats.
func (e *env) printInboxPauses(st []operate.InboxStats) {
	for _, s := range st {
		if s.PausedAt != nil {
			fmt.Fprintf(e.stdout, "  inbox consumer %s is paused since %s: its processors claim nothing until `wmonce resume -consumer %s`\n",
				s.Consumer, when(*s.PausedAt), shellQuote(s.Consumer))
		}
	}
}

// printRelayPauses adds the paused relays and the delayed rows to the outbox stats.
func (e *env) printRelayPauses(o operate.OutboxStats) {
	for _, r := range o.Relays {
		if r.PausedAt != nil {
			fmt.Fprintf(e.stdout, "  relay %s is paused since %s: it publishes nothing until `wmonce resume -relay %s`\n", r.Name, when(*r.PausedAt), shellQuote(r.Name))
		}
		if r.Delayed > 0 {
			next := time.Time{}
			if r.NextDue != nil {
				next = *r.NextDue
			}
			fmt.Fprintf(e.stdout, "  relay %s keeps %d delayed row(s) in outbox_delayed until they are due; the next at %s\n", r.Name, r.Delayed, when(next))
		}
	}
}
