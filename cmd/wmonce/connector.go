package main

import (
	"cmp"
	"context"
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
			{name: "config", new: newConnector("config", (*connector).config)},
			{name: "apply", db: (*env).openMigrated, new: newConnector("apply", (*connector).apply)},
			{name: "status", db: (*env).open, new: newConnector("status", (*connector).status)},
			{name: "delete", db: (*env).open, new: newConnector("delete", (*connector).delete)},
		},
	}
}

// connector is a `wmonce connector` action: the flags every action takes, and what it does
// with the connector's configuration and the Connect client built from them.
type connector struct {
	connectURL, user, databaseURL, name, passwordRef string
	partitions                                       int
	noExactlyOnce, showPassword                      bool
	do                                               func(c *connector, ctx context.Context, e *env, cfg cdc.Config, client cdc.Client) error
}

func newConnector(action string, do func(c *connector, ctx context.Context, e *env, cfg cdc.Config, client cdc.Client) error) func(*flag.FlagSet) runner {
	return func(fs *flag.FlagSet) runner {
		c := &connector{do: do}
		fs.StringVar(&c.connectURL, "connect-url", cmp.Or(os.Getenv("CONNECT_URL"), cdc.DefaultConnectURL), "Kafka Connect REST API")
		fs.StringVar(&c.user, "user", cdc.DefaultReplicationRole, "role the connector logs in with (REPLICATION LOGIN)")
		fs.StringVar(&c.databaseURL, "connector-database-url", "", "PostgreSQL as the Connect workers reach it (default: -database-url)")
		fs.StringVar(&c.name, "name", "", "connector name (default wmonce-outbox-<schema>)")
		fs.StringVar(&c.passwordRef, "password-ref", "", "Connect config variable the workers resolve to the role's password, e.g. ${file:/etc/wmonce/cdc.properties:password}, instead of a password in the URL (stored in clear by Connect)")
		fs.IntVar(&c.partitions, "partitions", cdc.DefaultTopicPartitions, "partitions of the topics Connect creates")
		fs.BoolVar(&c.noExactlyOnce, "no-exactly-once", false, "do not require exactly-once source support (a worker's death then duplicates events)")
		if action == "config" {
			fs.BoolVar(&c.showPassword, "show-password", false, "print the password of the database URL instead of "+maskedPassword)
		}
		return c
	}
}

// run builds the connector's configuration (for the schema and database of the global flags)
// and the Connect client, and does the action with them.
func (c *connector) run(ctx context.Context, e *env) error {
	cfg := cdc.Config{
		Schema: e.g.schema, DatabaseURL: cmp.Or(c.databaseURL, e.g.databaseURL), User: c.user, Name: c.name,
		PasswordReference: c.passwordRef, TopicPartitions: c.partitions, DisableExactlyOnce: c.noExactlyOnce,
	}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return usagef("%v", err)
	}
	return c.do(c, ctx, e, cfg, cdc.Client{URL: c.connectURL})
}

// maskedPassword stands in connector config's output for a password read from the database
// URL: printed output ends up in terminals, logs and tickets.
const maskedPassword = "********"

func (c *connector) config(_ context.Context, e *env, cfg cdc.Config, _ cdc.Client) error {
	conf, err := cdc.ConnectorConfig(cfg)
	if err != nil {
		return err
	}
	if _, ok := conf["database.password"]; ok && cfg.PasswordReference == "" && !c.showPassword {
		conf["database.password"] = maskedPassword
		fmt.Fprintln(e.stderr, "note: database.password is masked: pass -show-password to print it, or -password-ref to keep it out of the configuration")
	}
	return e.printJSON(map[string]any{"name": cfg.Name, "config": conf})
}

func (c *connector) apply(ctx context.Context, e *env, cfg cdc.Config, client cdc.Client) error {
	if err := cdc.Prepare(ctx, e.db, cfg); err != nil {
		return err
	}
	if err := client.Apply(ctx, cfg); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "connector %s applied on %s (slot %s, publication %s); check it with: wmonce connector status\n", cfg.Name, client.URL, cfg.SlotName, cfg.PublicationName)
	if hasPassword(cfg.DatabaseURL) {
		fmt.Fprintln(e.stderr, "warning: Connect stores the password of the connector's database URL in clear (config topic, GET /connectors/<name>/config): pass it with -password-ref instead")
	}
	return nil
}

// hasPassword reports whether the database URL holds a password.
func hasPassword(databaseURL string) bool {
	u, err := url.Parse(databaseURL)
	if err != nil || u.User == nil {
		return false
	}
	_, ok := u.User.Password()
	return ok
}

// connectorState is what status prints.
type connectorState struct {
	Name   string         `json:"name"`
	Status *cdc.Status    `json:"status,omitempty"`
	Error  string         `json:"error,omitempty"`
	Slot   cdc.SlotStatus `json:"slot"`
}

func (c *connector) status(ctx context.Context, e *env, cfg cdc.Config, client cdc.Client) error {
	st := connectorState{Name: cfg.Name}
	s, serr := client.Status(ctx, cfg.Name)
	if serr != nil {
		st.Error = serr.Error()
	} else {
		st.Status = &s
	}
	var err error
	if st.Slot, err = cdc.Slot(ctx, e.db, cfg); err != nil {
		return err
	}
	if err := show(e, st, func(st connectorState) { e.printConnectorState(cfg, st) }); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	return notRunning(s, cfg.Name)
}

// printConnectorState prints the connector's state, its tasks' and the slot's.
func (e *env) printConnectorState(cfg cdc.Config, st connectorState) {
	tw := e.table()
	if st.Status != nil {
		fmt.Fprintf(tw, "connector\t%s\t%s\t%s\n", cfg.Name, st.Status.Connector.State, st.Status.Connector.WorkerID)
		for _, t := range st.Status.Tasks {
			fmt.Fprintf(tw, "task %d\t\t%s\t%s\n", t.ID, t.State.State, t.WorkerID)
		}
	} else {
		fmt.Fprintf(tw, "connector\t%s\t%s\n", cfg.Name, st.Error)
	}
	fmt.Fprintf(tw, "slot\t%s\texists %t, active %t, retains %d bytes of WAL, %d bytes behind\n", cfg.SlotName, st.Slot.Exists, st.Slot.Active, st.Slot.RetainedBytes, st.Slot.LagBytes)
	_ = tw.Flush()
}

// notRunning is the error of a connector that does not run: a failed task's trace, if any.
func notRunning(s cdc.Status, name string) error {
	if s.Running() {
		return nil
	}
	for _, t := range s.Tasks {
		if t.Trace != "" {
			return fmt.Errorf("task %d is %s: %.400s", t.ID, t.State.State, t.Trace)
		}
	}
	return fmt.Errorf("connector %s is not running (connector %s)", name, s.Connector.State)
}

func (c *connector) delete(ctx context.Context, e *env, cfg cdc.Config, client cdc.Client) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := cdc.Remove(ctx, client, e.db, cfg); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "connector %s deleted; slot %s and publication %s dropped\n", cfg.Name, cfg.SlotName, cfg.PublicationName)
	return nil
}
