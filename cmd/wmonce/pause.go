package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/outbox"
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
		run:      func(ctx context.Context, e *env, args []string) error { return e.setPaused(ctx, args, true) },
	}
}

func resumeCommand() *command {
	return &command{
		name:     "resume",
		summary:  "resume a paused inbox consumer or relay",
		usage:    "\nresume -consumer C\nresume -relay R",
		details:  "\nUndoes `wmonce pause`: the consumer's processors claim again, the relay goes on from its\nposition, at once where they LISTEN, otherwise within their PollInterval.",
		examples: []string{"wmonce resume -consumer billing", "wmonce resume -relay kafka"},
		run:      func(ctx context.Context, e *env, args []string) error { return e.setPaused(ctx, args, false) },
	}
}

// pauseResult is what pause and resume print with -json.
type pauseResult struct {
	Consumer string `json:"consumer,omitempty"`
	Relay    string `json:"relay,omitempty"`
	Paused   bool   `json:"paused"`
	// Changed is false when it was already in that state.
	Changed bool `json:"changed"`
}

func (e *env) setPaused(ctx context.Context, args []string, pause bool) error {
	verb := map[bool]string{true: "pause", false: "resume"}[pause]
	fs := e.flags(verb)
	consumer := fs.String("consumer", "", "the inbox consumer (its ReceiverConfig.Consumer)")
	relay := fs.String("relay", "", "the relay (its RelayConfig.Name)")
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if (strings.TrimSpace(*consumer) == "") == (strings.TrimSpace(*relay) == "") {
		return usagef("give -consumer or -relay (one of them): `wmonce status` lists both")
	}
	if err := checkInput(operate.CheckConsumer("-consumer", *consumer), operate.CheckConsumer("-relay", *relay)); err != nil {
		return err
	}
	res := pauseResult{Consumer: *consumer, Relay: *relay, Paused: pause, Changed: true}
	var err error
	if *consumer != "" {
		res.Changed, err = e.setConsumerPaused(ctx, *consumer, pause)
	} else {
		res.Changed, err = e.setRelayPaused(ctx, *relay, pause)
	}
	if err != nil {
		return err
	}
	if e.g.json {
		return e.printJSON(res)
	}
	e.printPaused(res)
	return nil
}

// setConsumerPaused pauses or resumes an inbox consumer; false when it was in that state.
func (e *env) setConsumerPaused(ctx context.Context, consumer string, pause bool) (bool, error) {
	ops, err := e.ops(ctx)
	if err != nil {
		return false, err
	}
	var changed bool
	if pause {
		changed, err = ops.Pause(ctx, consumer)
	} else {
		changed, err = ops.Resume(ctx, consumer)
	}
	if err != nil {
		return false, e.explain(err)
	}
	return changed, nil
}

// setRelayPaused pauses or resumes a relay; false when it was in that state.
func (e *env) setRelayPaused(ctx context.Context, relay string, pause bool) (bool, error) {
	db, err := e.openMigrated(ctx)
	if err != nil {
		return false, err
	}
	var changed bool
	if pause {
		changed, err = outbox.PauseRelay(ctx, db, e.g.schema, relay)
	} else {
		changed, err = outbox.ResumeRelay(ctx, db, e.g.schema, relay)
	}
	if err != nil { // outbox.ErrRelayNotFound: a relay registers its name when it first runs
		return false, e.explain(err)
	}
	return changed, nil
}

// printPaused says what pause or resume did.
func (e *env) printPaused(res pauseResult) {
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
