package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"strings"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/sqlrebase"
	"github.com/wmonce/watermill-once/pgtx"
)

func rebaseCommand() *command {
	return &command{
		name:    "rebase",
		summary: "after a restore or a move into another cluster: rebase the relay positions so that nothing is lost",
		usage:   "rebase [-broker-schema NAME] [-dry-run]",
		details: `
Positions are transaction ids of the cluster they were recorded on, and a logical dump restored
into another cluster (pg_dump/pg_restore, a logical-replication move) does not keep those ids.
When the new cluster's transaction counter is lower, a relay would skip every row written after
the restore: the relays stop forwarding and log at ERROR, Prune refuses, and status, doctor,
the metrics (wmonce_outbox_position_moved) and the admin page say to run this command.

In one transaction with the positions locked it gives every outbox row that is not provably
forwarded (or was written after the restore) this cluster's transaction id, so the relays
forward it again in insertion order; gives rows every relay forwarded a frozen id, so they
count as forwarded and retention may delete them; and resets every relay position to this
cluster's current snapshot, recording its system identifier. Nothing unforwarded is lost; a
row already forwarded may be published again, which the consumers' claims (the
effectively-once middleware, the inbox) absorb. Relays may keep running: they go on by
themselves within a few seconds. A schema whose positions are of this cluster is left as it is
(a restore into a cluster with a higher counter needs nothing; its new system identifier is
recorded). Run it again at will.

-broker-schema also rebases the SQL broker's topic tables in that schema (BROKER_SQL_SCHEMA),
so that its subscriptions read again the messages their stored positions hide.
-dry-run only reports what the checks find. See docs/operations.md, Backup, restore and
moving a database.`,
		examples: []string{
			"wmonce rebase -dry-run",
			"wmonce -schema payments rebase -broker-schema wmonce_broker",
		},
		actions: []action{{db: (*env).openMigrated, new: newRebase}},
	}
}

// sqlBrokerRebase rebases the SQL broker's topic tables of a schema, and sqlBrokerCheck reports
// them, for -broker-schema.
var (
	sqlBrokerRebase = func(ctx context.Context, db *sql.DB, schema string) (any, error) {
		return sqlrebase.Rebase(ctx, db, schema)
	}
	sqlBrokerCheck = func(ctx context.Context, db *sql.DB, schema string) (any, error) {
		return sqlrebase.Check(ctx, db, schema)
	}
)

// rebaseReport is `wmonce rebase -json`.
type rebaseReport struct {
	Before outboxops.PositionReport `json:"before"`
	Rebase *outboxops.RebaseReport  `json:"rebase,omitempty"`
	Broker any                      `json:"broker,omitempty"`
}

// rebase is `wmonce rebase`.
type rebase struct {
	brokerSchema string
	dryRun       bool
}

func newRebase(fs *flag.FlagSet) runner {
	r := &rebase{}
	fs.StringVar(&r.brokerSchema, "broker-schema", "", "also rebase the SQL broker's topic tables in this schema")
	fs.BoolVar(&r.dryRun, "dry-run", false, "only report what the checks find")
	return r
}

func (r *rebase) check([]string) error {
	if r.brokerSchema == "" {
		return nil
	}
	return checkInput(pgtx.ValidateIdentifier("-broker-schema", r.brokerSchema))
}

func (r *rebase) run(ctx context.Context, e *env) error {
	var rep rebaseReport
	var err error
	if rep.Before, err = outboxops.CheckPositions(ctx, e.db, e.g.schema); err != nil {
		return err
	}
	if r.dryRun {
		rep.Broker, err = r.broker(ctx, e.db, sqlBrokerCheck)
	} else {
		err = r.rebase(ctx, e, &rep)
	}
	if err != nil {
		return err
	}
	return show(e, rep, e.printRebase)
}

// rebase rebases the relay positions, and the SQL broker's topic tables with -broker-schema.
func (r *rebase) rebase(ctx context.Context, e *env, rep *rebaseReport) error {
	positions, err := outboxops.RebasePositions(ctx, e.db, e.g.schema)
	if err != nil {
		return err
	}
	rep.Rebase = &positions
	rep.Broker, err = r.broker(ctx, e.db, sqlBrokerRebase)
	return err
}

// broker runs do (sqlBrokerCheck or sqlBrokerRebase) on -broker-schema, if given.
func (r *rebase) broker(ctx context.Context, db *sql.DB, do func(context.Context, *sql.DB, string) (any, error)) (any, error) {
	if r.brokerSchema == "" {
		return nil, nil
	}
	return do(ctx, db, r.brokerSchema)
}

func (e *env) printRebase(r rebaseReport) {
	w := e.stdout
	moved := r.Before.Moved()
	if len(moved) == 0 {
		fmt.Fprintf(w, "Positions of schema %s were recorded on this cluster: nothing to rebase\n", r.Before.Schema)
	}
	for _, c := range moved {
		fmt.Fprintf(w, "RESTORED: %s\n", c.Finding(r.Before.Schema))
	}
	switch {
	case r.Rebase == nil && len(moved) > 0:
		fmt.Fprintf(w, "dry run: `wmonce -schema %s rebase` rebases them\n", r.Before.Schema)
	case r.Rebase != nil && len(r.Rebase.Positions) > 0:
		fmt.Fprintf(w, "rebased %s: %d outbox row(s) will be forwarded again (consumers' claims absorb the ones forwarded before), %d forwarded row(s) frozen\n",
			strings.Join(r.Rebase.Positions, ", "), r.Rebase.Republished, r.Rebase.Frozen)
	case r.Rebase != nil && r.Rebase.Rerecorded:
		fmt.Fprintf(w, "restored into a cluster with a higher transaction counter: nothing lost; system identifier %s recorded\n", r.Rebase.SystemIdentifier)
	}
	if r.Broker != nil {
		fmt.Fprintf(w, "SQL broker: %v\n", r.Broker)
	}
}
