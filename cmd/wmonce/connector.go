package main

import (
	"cmp"
	"context"
	"database/sql"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/wmonce/watermill-once/outbox/cdc"
)

func connectorCommand() *command {
	return &command{
		name:    "connector",
		summary: "the Debezium connector that reads the outbox on Kafka Connect: config, apply, status, delete",
		usage: `
connector config [-user ROLE] [-connector-database-url URL] [-name N] [-partitions N] [-no-exactly-once] [-show-password]
connector apply  [-connect-url URL] [same flags as config]
connector status [-connect-url URL] [-name N]
connector delete [-connect-url URL] [-name N]`,
		details: `
config   prints the connector's configuration for the schema's outbox (JSON, as Connect's REST
         API takes it): exactly-once required, poll.interval.ms=10, pgoutput with a
         publication of our own, the raw payload (BinaryDataConverter) and Debezium's Outbox
         Event Router on the outbox columns of migration 013. A password taken from the
         database URL is printed masked unless -show-password is given (a -password-ref
         reference is printed as it is: it holds no secret).
apply    prepares PostgreSQL (checks wal_level=logical, creates the publication, grants the
         role SELECT on the outbox) and creates the connector or updates its configuration.
         Run it as the role that owns the outbox. Stop the Relay of the outbox only once the
         connector runs (status): the consumers dedupe what both sent.
status   the connector's and its task's state, the worker running it, and the replication
         slot: whether a task reads it and how much WAL it retains. Exit code 1 unless it runs.
delete   deletes the connector, drops its replication slot (which otherwise retains WAL
         without end) and the publication. Start the Relay first when switching back.
-connect-url defaults to $CONNECT_URL, else ` + cdc.DefaultConnectURL + `; -connector-database-url (the database as the
Connect workers reach it) to -database-url.`,
		examples: []string{
			"wmonce connector config",
			"wmonce -schema shop connector apply -connect-url http://connect:8083 -user wmonce_cdc",
			"wmonce -json connector status",
			"wmonce connector delete",
		},
		actions: []action{
			{name: "config", run: (*env).connectorConfig},
			{name: "apply", run: (*env).connectorApply},
			{name: "status", run: (*env).connectorStatus},
			{name: "delete", run: (*env).connectorDelete},
		},
	}
}

// connectorFlags are the flags of the connector actions.
type connectorFlags struct {
	connectURL, user, databaseURL, name *string
	passwordRef                         *string
	partitions                          *int
	noExactlyOnce                       *bool
}

func (e *env) connectorFlags(action string) (*flag.FlagSet, connectorFlags) {
	fs := e.flags("connector " + action)
	return fs, connectorFlags{
		connectURL:    fs.String("connect-url", cmp.Or(os.Getenv("CONNECT_URL"), cdc.DefaultConnectURL), "Kafka Connect REST API"),
		user:          fs.String("user", cdc.DefaultReplicationRole, "role the connector logs in with (REPLICATION LOGIN)"),
		databaseURL:   fs.String("connector-database-url", "", "PostgreSQL as the Connect workers reach it (default: -database-url)"),
		name:          fs.String("name", "", "connector name (default wmonce-outbox-<schema>)"),
		passwordRef:   fs.String("password-ref", "", "Connect config variable the workers resolve to the role's password, e.g. ${file:/etc/wmonce/cdc.properties:password}, instead of a password in the URL (stored in clear by Connect)"),
		partitions:    fs.Int("partitions", cdc.DefaultTopicPartitions, "partitions of the topics Connect creates"),
		noExactlyOnce: fs.Bool("no-exactly-once", false, "do not require exactly-once source support (a worker's death then duplicates events)"),
	}
}

// connectorRun is what a connector action works with.
type connectorRun struct {
	cfg    cdc.Config
	client cdc.Client
	db     *sql.DB // nil unless the action opened the database
}

// connectorSetup parses the flags every connector action takes, builds the connector's
// configuration and the Connect client from them, and opens the database with open unless it
// is nil. extra, unless nil, declares the flags of the action's own.
func (e *env) connectorSetup(ctx context.Context, action string, args []string, open func(context.Context) (*sql.DB, error), extra func(*flag.FlagSet)) (connectorRun, error) {
	fs, f := e.connectorFlags(action)
	if extra != nil {
		extra(fs)
	}
	if err := e.parseFlagsOnly(fs, args); err != nil {
		return connectorRun{}, err
	}
	r := connectorRun{
		cfg: cdc.Config{
			Schema: e.g.schema, DatabaseURL: cmp.Or(*f.databaseURL, e.g.databaseURL), User: *f.user, Name: *f.name,
			PasswordReference: *f.passwordRef, TopicPartitions: *f.partitions, DisableExactlyOnce: *f.noExactlyOnce,
		}.WithDefaults(),
		client: cdc.Client{URL: *f.connectURL},
	}
	if err := r.cfg.Validate(); err != nil {
		return connectorRun{}, usagef("%v", err)
	}
	if open != nil {
		db, err := open(ctx)
		if err != nil {
			return connectorRun{}, err
		}
		r.db = db
	}
	return r, nil
}

// maskedPassword stands in connector config's output for a password read from the database
// URL: printed output ends up in terminals, logs and tickets.
const maskedPassword = "********"

func (e *env) connectorConfig(ctx context.Context, args []string) error {
	var showPassword bool
	r, err := e.connectorSetup(ctx, "config", args, nil, func(fs *flag.FlagSet) {
		fs.BoolVar(&showPassword, "show-password", false, "print the password of the database URL instead of "+maskedPassword)
	})
	if err != nil {
		return err
	}
	cfg := r.cfg
	c, err := cdc.ConnectorConfig(cfg)
	if err != nil {
		return err
	}
	if _, ok := c["database.password"]; ok && cfg.PasswordReference == "" && !showPassword {
		c["database.password"] = maskedPassword
		fmt.Fprintln(e.stderr, "note: database.password is masked: pass -show-password to print it, or -password-ref to keep it out of the configuration")
	}
	return e.printJSON(map[string]any{"name": cfg.Name, "config": c})
}

func (e *env) connectorApply(ctx context.Context, args []string) error {
	r, err := e.connectorSetup(ctx, "apply", args, e.openMigrated, nil)
	if err != nil {
		return err
	}
	cfg, client := r.cfg, r.client
	if err := cdc.Prepare(ctx, r.db, cfg); err != nil {
		return e.explain(err)
	}
	if err := client.Apply(ctx, cfg); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "connector %s applied on %s (slot %s, publication %s); check it with: wmonce connector status\n", cfg.Name, client.URL, cfg.SlotName, cfg.PublicationName)
	if u, err := url.Parse(cfg.DatabaseURL); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			fmt.Fprintln(e.stderr, "warning: Connect stores the password of the connector's database URL in clear (config topic, GET /connectors/<name>/config): pass it with -password-ref instead")
		}
	}
	return nil
}

// connectorState is what status prints.
type connectorState struct {
	Name   string         `json:"name"`
	Status *cdc.Status    `json:"status,omitempty"`
	Error  string         `json:"error,omitempty"`
	Slot   cdc.SlotStatus `json:"slot"`
}

func (e *env) connectorStatus(ctx context.Context, args []string) error {
	r, err := e.connectorSetup(ctx, "status", args, e.open, nil)
	if err != nil {
		return err
	}
	cfg, client := r.cfg, r.client
	st := connectorState{Name: cfg.Name}
	s, serr := client.Status(ctx, cfg.Name)
	if serr != nil {
		st.Error = serr.Error()
	} else {
		st.Status = &s
	}
	if st.Slot, err = cdc.Slot(ctx, r.db, cfg); err != nil {
		return err
	}
	if e.g.json {
		if err := e.printJSON(st); err != nil {
			return err
		}
	} else {
		tw := e.table()
		if st.Status != nil {
			fmt.Fprintf(tw, "connector\t%s\t%s\t%s\n", cfg.Name, s.Connector.State, s.Connector.WorkerID)
			for _, t := range s.Tasks {
				fmt.Fprintf(tw, "task %d\t\t%s\t%s\n", t.ID, t.State.State, t.WorkerID)
			}
		} else {
			fmt.Fprintf(tw, "connector\t%s\t%s\n", cfg.Name, st.Error)
		}
		fmt.Fprintf(tw, "slot\t%s\texists %t, active %t, retains %d bytes of WAL, %d bytes behind\n", cfg.SlotName, st.Slot.Exists, st.Slot.Active, st.Slot.RetainedBytes, st.Slot.LagBytes)
		_ = tw.Flush()
	}
	if serr != nil {
		return serr
	}
	if !s.Running() {
		for _, t := range s.Tasks {
			if t.Trace != "" {
				return fmt.Errorf("task %d is %s: %.400s", t.ID, t.State.State, t.Trace)
			}
		}
		return fmt.Errorf("connector %s is not running (connector %s)", cfg.Name, s.Connector.State)
	}
	return nil
}

func (e *env) connectorDelete(ctx context.Context, args []string) error {
	r, err := e.connectorSetup(ctx, "delete", args, e.open, nil)
	if err != nil {
		return err
	}
	cfg := r.cfg
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := cdc.Remove(ctx, r.client, r.db, cfg); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "connector %s deleted; slot %s and publication %s dropped\n", cfg.Name, cfg.SlotName, cfg.PublicationName)
	return nil
}
