package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/sqlrebase"
	"github.com/wmonce/watermill-once/pgtx"
)

// brokerSchemaFlag adds -broker-schema to status and doctor: the SQL broker schema whose topic
// tables they check against this cluster (sqlrebase.Check); "" skips the check.
func brokerSchemaFlag(fs *flag.FlagSet) *string {
	return fs.String("broker-schema", os.Getenv(broker.EnvSQLSchema),
		"also check the SQL broker's topic tables in this schema for ids of another cluster (default $"+broker.EnvSQLSchema+"; unset: no check)")
}

// checkBrokerTables runs sqlrebase.Check on schema; nil report when schema is "".
func (e *env) checkBrokerTables(ctx context.Context, schema string) (*sqlrebase.MoveReport, error) {
	if schema == "" {
		return nil, nil
	}
	if err := pgtx.ValidateIdentifier("-broker-schema", schema); err != nil {
		return nil, usagef("%v", err)
	}
	db, err := e.open(ctx)
	if err != nil {
		return nil, err
	}
	r, err := sqlrebase.Check(ctx, db, schema)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// printBrokerTables prints a RESTORED line per moved topic table, or one ok line.
func (e *env) printBrokerTables(r *sqlrebase.MoveReport, indent string) {
	if r == nil {
		return
	}
	if len(r.Moved) == 0 {
		fmt.Fprintf(e.stdout, "%sok: the SQL broker's topic tables of schema %s (%d) were written on this cluster\n", indent, r.Schema, r.Topics)
		return
	}
	for _, m := range r.Moved {
		fmt.Fprintf(e.stdout, "%sRESTORED: SQL broker schema %s, topic %s: %d row(s) and groups [%s] are ahead of this cluster's transaction counter, so its subscriptions receive nothing: run `wmonce -schema %s rebase -broker-schema %s`\n",
			indent, r.Schema, m.Topic, m.FutureRows, cmp.Or(strings.Join(m.GroupsAhead, ", "), "none"), e.g.schema, r.Schema)
	}
}

// isUsage reports a command-line mistake (exit code 2), which status and doctor return at once
// instead of reporting a section as unreadable.
func isUsage(err error) bool {
	var ue *usageError
	return errors.As(err, &ue)
}
