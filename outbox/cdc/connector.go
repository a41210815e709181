// Package cdc moves the outbox into Kafka with Debezium's connector and Outbox Event Router on
// Kafka Connect, instead of outbox.Relay: it prepares PostgreSQL and registers, checks and
// removes the connector through Connect's REST API.
//
// Guarantee: with the defaults (exactly.once.support=required on workers with
// exactly.once.source.support=enabled), the connector writes each committed outbox row to Kafka
// once, in commit order per partition key, and a distributed Connect cluster moves its task
// when a worker dies. Where it stops: Kafka to the consumer stays at-least-once, and a switch
// between the Relay and Debezium can deliver an event twice; the effectively-once middleware
// dedupes both on the event's UUID. The slot retains WAL while the connector is down (Slot).
// outbox.Prune keeps every row the slot has not confirmed. Settings, retention and the
// versions that work together: docs/cdc.md.
package cdc

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// Config's defaults.
const (
	// defaultPollInterval is Debezium's poll.interval.ms: 10 ms gave a p50 commit-to-consumer
	// latency of 32 ms with exactly-once on, against 643 ms with Debezium's default of 500 ms.
	defaultPollInterval = 10 * time.Millisecond
	// defaultHeartbeatInterval keeps the slot's position moving on a quiet database, so that
	// the slot does not retain WAL written by other tables.
	defaultHeartbeatInterval = 10 * time.Second
)

// Defaults the CLI and the examples share (e2e/services sets them up).
const (
	DefaultTopicPartitions = 3
	DefaultReplicationRole = "wmonce_cdc"
	DefaultConnectURL      = "http://127.0.0.1:8083"
)

// Config describes the Debezium connector for one outbox schema.
type Config struct {
	Schema      string // the outbox's; default pgtx.DefaultSchema
	DatabaseURL string // postgres://user[:password]@host:port/db as the workers see it; required
	// PasswordReference replaces the URL's password with a Connect config variable the workers
	// resolve (${file:path:key}, ${env:NAME}), kept out of Connect's config topic; not both.
	PasswordReference string
	User              string // the connector's role (REPLICATION, LOGIN); default the URL's user
	// Name, SlotName and PublicationName default to "wmonce-outbox-<schema>" (_ as -),
	// "wmonce_<schema>" and "wmonce_outbox_<schema>"; one slot per connector.
	Name, SlotName, PublicationName string
	PollInterval                    time.Duration // poll.interval.ms: default 10ms, at least 1ms
	HeartbeatInterval               time.Duration // heartbeat.interval.ms: default 10s
	// TopicPartitions and TopicReplicationFactor of the topics Connect creates: default
	// DefaultTopicPartitions and -1 (the cluster's).
	TopicPartitions, TopicReplicationFactor int
	// DisableExactlyOnce lets the connector run on workers without exactly-once source
	// support; a worker's death then duplicates events, which the middleware dedupes.
	DisableExactlyOnce bool
}

// WithDefaults returns c with its defaults applied.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	db, _ := parseDatabaseURL(c.DatabaseURL)
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.User = cmp.Or(c.User, db.user)
	c.Name = cmp.Or(c.Name, "wmonce-outbox-"+strings.ReplaceAll(c.Schema, "_", "-"))
	c.SlotName = cmp.Or(c.SlotName, "wmonce_"+c.Schema)
	c.PublicationName = cmp.Or(c.PublicationName, "wmonce_outbox_"+c.Schema)
	c.PollInterval = cmp.Or(c.PollInterval, defaultPollInterval)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, defaultHeartbeatInterval)
	c.TopicPartitions = cmp.Or(c.TopicPartitions, DefaultTopicPartitions)
	c.TopicReplicationFactor = cmp.Or(c.TopicReplicationFactor, -1)
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	db, urlErr := parseDatabaseURL(c.DatabaseURL)
	err := errors.Join(
		pgtx.ValidateIdentifier("schema", c.Schema),
		urlErr,
		// Slot names: lower-case letters, digits and underscores, at most 63 bytes (PostgreSQL).
		pgtx.ValidateIdentifier("slot", c.SlotName),
		pgtx.ValidateIdentifier("publication", c.PublicationName),
		c.checkLogin(db),
		checkConnectorName(c.Name),
		setup.AtLeast("PollInterval", c.PollInterval, time.Millisecond),
		setup.NotNegative("HeartbeatInterval", c.HeartbeatInterval),
		setup.AtLeast("TopicPartitions", c.TopicPartitions, 1),
		checkReplicationFactor(c.TopicReplicationFactor),
	)
	if err != nil {
		return fmt.Errorf("cdc: invalid config: %w", err)
	}
	return nil
}

// checkLogin checks how the connector logs in: a user, and its password either in the URL or
// by reference, not both.
func (c Config) checkLogin(db database) error {
	switch {
	case c.User == "":
		return errors.New("no User, and DatabaseURL names none")
	case c.PasswordReference == "":
		return nil
	case !configVariable.MatchString(c.PasswordReference):
		return fmt.Errorf("PasswordReference %q is not a Connect config variable ${provider:[path:]key}", c.PasswordReference)
	case db.password != "":
		return errors.New("PasswordReference is set and DatabaseURL carries a password too: drop the password from the URL")
	}
	return nil
}

// checkConnectorName refuses a name that cannot be a path segment of Connect's REST API.
func checkConnectorName(name string) error {
	if name == "" || strings.ContainsAny(name, "/ ?#%") {
		return fmt.Errorf("connector name %q must be non-empty without '/', spaces, '?', '#' or '%%'", name)
	}
	return nil
}

// checkReplicationFactor accepts -1 (the cluster's default) or a factor of at least 1.
func checkReplicationFactor(f int) error {
	if f == -1 {
		return nil
	}
	return setup.AtLeast("TopicReplicationFactor (or -1)", f, 1)
}

// configVariable is a Connect config variable (KIP-297): ${provider:key} or
// ${provider:path:key}.
var configVariable = regexp.MustCompile(`^\$\{[A-Za-z0-9_.-]+:[^{}]+\}$`)

type database struct{ host, port, user, password, name string }

// parseDatabaseURL reads the parts of DatabaseURL the connector's configuration names apart.
func parseDatabaseURL(s string) (database, error) {
	u, err := url.Parse(s)
	if err != nil || !slices.Contains([]string{"postgres", "postgresql"}, u.Scheme) || u.Host == "" {
		return database{}, fmt.Errorf("DatabaseURL %q is not postgres://user@host:port/database", redact(s))
	}
	db := database{host: u.Hostname(), port: cmp.Or(u.Port(), "5432"), name: strings.TrimPrefix(u.Path, "/"), user: u.User.Username()}
	db.password, _ = u.User.Password() // both nil-safe: a URL without a user has neither
	if db.name == "" {
		return database{}, fmt.Errorf("DatabaseURL %q names no database", redact(s))
	}
	return db, nil
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(unparsable)"
}

// Router columns: the outbox columns of migration 013 the Outbox Event Router reads.
const (
	columnID           = "uuid"
	columnDestination  = "destination"
	columnPartitionKey = "partition_key"
	columnPayload      = "payload_bytes"
	columnMetadata     = "metadata"
)

// ConnectorConfig returns the connector's configuration for Connect's REST API, defaults
// applied (docs/cdc.md, The connector's settings).
func ConnectorConfig(config Config) (map[string]string, error) {
	// One task: a slot has one reader. publication.autocreate.mode=disabled: the default needs a
	// superuser. snapshot.mode=no_data: rows committed before the slot were the Relay's. Deletes
	// are ignored: a row retention deletes is not an event.
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	db, _ := parseDatabaseURL(config.DatabaseURL)
	ms := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	c := map[string]string{
		"connector.class":                         "io.debezium.connector.postgresql.PostgresConnector",
		"tasks.max":                               "1",
		"database.hostname":                       db.host,
		"database.port":                           db.port,
		"database.user":                           config.User,
		"database.dbname":                         db.name,
		"topic.prefix":                            config.Name,
		"plugin.name":                             "pgoutput",
		"slot.name":                               config.SlotName,
		"publication.name":                        config.PublicationName,
		"publication.autocreate.mode":             "disabled",
		"table.include.list":                      config.Schema + ".outbox",
		"snapshot.mode":                           "no_data",
		"tombstones.on.delete":                    "false",
		"poll.interval.ms":                        ms(config.PollInterval),
		"heartbeat.interval.ms":                   ms(config.HeartbeatInterval),
		"key.converter":                           "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":                         "io.debezium.converters.BinaryDataConverter",
		"value.converter.delegate.converter.type": "org.apache.kafka.connect.json.JsonConverter",
		"value.converter.delegate.converter.type.schemas.enable": "false",
		"header.converter":                          "org.apache.kafka.connect.storage.SimpleHeaderConverter",
		"topic.creation.default.partitions":         strconv.Itoa(config.TopicPartitions),
		"topic.creation.default.replication.factor": strconv.Itoa(config.TopicReplicationFactor),
		"transforms":                                          "outbox",
		"transforms.outbox.type":                              "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.route.by.field":                    columnDestination,
		"transforms.outbox.route.topic.replacement":           "${routedByValue}",
		"transforms.outbox.table.field.event.id":              columnID,
		"transforms.outbox.table.field.event.key":             columnPartitionKey,
		"transforms.outbox.table.field.event.payload":         columnPayload,
		"transforms.outbox.table.fields.additional.placement": columnMetadata + ":header:metadata",
		"transforms.outbox.table.expand.json.payload":         "false",
		"transforms.outbox.table.op.invalid.behavior":         "warn",
	}
	if password := cmp.Or(config.PasswordReference, db.password); password != "" {
		c["database.password"] = password
	}
	if !config.DisableExactlyOnce {
		c["exactly.once.support"] = "required"
		c["transaction.boundary"] = "poll"
	}
	return c, nil
}
