// Package cdc moves the outbox into Kafka with Debezium's PostgreSQL connector and its Outbox
// Event Router, on a Kafka Connect cluster, instead of the built-in outbox.Relay: it produces
// the connector's configuration for an outbox schema, prepares PostgreSQL for it (publication,
// grants) and registers, updates, checks and removes the connector through Connect's REST API.
//
// Guarantee: with the defaults (exactly.once.support=required on a worker with
// exactly.once.source.support=enabled), the connector writes each committed outbox row to Kafka
// once, in commit order per partition key, and a Connect cluster in distributed mode moves its
// task to another worker when one dies. Where it stops: Kafka to the consumer stays
// at-least-once (consumer restarts, rebalances), and a switch between the Relay and Debezium can
// deliver an event twice; the effectively-once middleware dedupes both on the event's UUID
// (broker.KafkaUnmarshaler reads Debezium's records back into the producer's message). The
// replication slot retains WAL while the connector is down: watch SlotLag.
//
// Retention: Prepare registers a position for the slot in outbox_offsets, which the retention
// janitor advances (retention.Config.CDCSlots, AdvancePosition) to what the slot has confirmed,
// so outbox.Prune deletes only rows whose events Debezium has written to Kafka; Remove forgets it.
//
// The versions that work together: Kafka Connect 4.3.1 with Debezium 3.6.1.Final (Connect 4.4.0
// fails to start Debezium's task); see docs/cdc.md.
package cdc

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

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

// The connector's defaults that the CLI, the examples and e2e/services share.
const (
	// DefaultTopicPartitions is the partition count of topics Connect creates (topics that
	// exist already keep theirs); the broker package's default too.
	DefaultTopicPartitions = 3
	// DefaultReplicationRole is the role e2e/services creates for the connector.
	DefaultReplicationRole = "wmonce_cdc"
	// DefaultConnectURL is the REST API of the first worker e2e/services starts.
	DefaultConnectURL = "http://127.0.0.1:8083"
)

// Config describes the Debezium connector for one outbox schema.
type Config struct {
	// Schema holds the outbox table. Default pgtx.DefaultSchema.
	Schema string
	// DatabaseURL is the PostgreSQL the connector reads, postgres://user[:password]@host:port/db
	// (as seen from the Connect workers). Required.
	DatabaseURL string
	// PasswordReference is what the connector's database.password holds instead of the
	// password of DatabaseURL: a Connect config variable such as
	// ${file:/etc/wmonce/cdc.properties:password} or ${env:WMONCE_CDC_PASSWORD}, which each
	// worker resolves through a config provider it declares (config.providers; e2e/services
	// and docker-compose.yml declare file and env). A password in DatabaseURL is stored in
	// clear in Connect's config topic and returned by GET /connectors/<name>/config; a
	// reference keeps it on the workers. Setting both is refused.
	PasswordReference string
	// User is the role the connector logs in with: REPLICATION and LOGIN, SELECT on the outbox
	// (Prepare grants it). Default: the URL's user.
	User string
	// Name of the connector. Default "wmonce-outbox-<schema>" (with _ as -).
	Name string
	// SlotName is the replication slot. Default "wmonce_<schema>". One per connector.
	SlotName string
	// PublicationName is the publication Prepare creates for the outbox table. Default
	// "wmonce_outbox_<schema>".
	PublicationName string
	// PollInterval is poll.interval.ms. Default 10 ms.
	PollInterval time.Duration
	// HeartbeatInterval is heartbeat.interval.ms. Default 10 seconds.
	HeartbeatInterval time.Duration
	// TopicPartitions for topics Connect creates. Default DefaultTopicPartitions.
	TopicPartitions int
	// TopicReplicationFactor for topics Connect creates; -1 asks the cluster. Default -1.
	TopicReplicationFactor int
	// DisableExactlyOnce drops exactly.once.support=required: the connector then also runs on
	// workers without exactly-once source support, and a worker's death duplicates events
	// (31 in 632 in one measured kill), which the middleware dedupes.
	DisableExactlyOnce bool
}

// WithDefaults returns c with its defaults applied: the names (Name, SlotName, ...) the
// connector will have.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	if c.User == "" {
		if u, err := url.Parse(c.DatabaseURL); err == nil && u.User != nil {
			c.User = u.User.Username()
		}
	}
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
	_, urlErr := parseDatabaseURL(c.DatabaseURL)
	errs := []error{
		pgtx.ValidateIdentifier("schema", c.Schema),
		urlErr,
		// Slot names: lower-case letters, digits and underscores, at most 63 bytes (PostgreSQL).
		pgtx.ValidateIdentifier("slot", c.SlotName),
		pgtx.ValidateIdentifier("publication", c.PublicationName),
	}
	if c.User == "" {
		errs = append(errs, errors.New("no User, and DatabaseURL names none"))
	}
	if c.PasswordReference != "" {
		if !configVariable.MatchString(c.PasswordReference) {
			errs = append(errs, fmt.Errorf("PasswordReference %q is not a Connect config variable ${provider:[path:]key}", c.PasswordReference))
		}
		if urlErr == nil {
			if db, _ := parseDatabaseURL(c.DatabaseURL); db.password != "" {
				errs = append(errs, errors.New("PasswordReference is set and DatabaseURL carries a password too: drop the password from the URL"))
			}
		}
	}
	if c.Name == "" || strings.ContainsAny(c.Name, "/ ?#%") {
		errs = append(errs, fmt.Errorf("connector name %q must be non-empty without '/', spaces, '?', '#' or '%%'", c.Name))
	}
	if c.PollInterval < time.Millisecond || c.HeartbeatInterval < 0 {
		errs = append(errs, errors.New("PollInterval must be at least 1ms and HeartbeatInterval not negative"))
	}
	if c.TopicPartitions < 1 || c.TopicReplicationFactor == 0 || c.TopicReplicationFactor < -1 {
		errs = append(errs, errors.New("TopicPartitions must be at least 1, TopicReplicationFactor -1 or at least 1"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cdc: invalid config: %w", err)
	}
	return nil
}

// configVariable is a Connect config variable (KIP-297): ${provider:key} or
// ${provider:path:key}.
var configVariable = regexp.MustCompile(`^\$\{[A-Za-z0-9_.-]+:[^{}]+\}$`)

type database struct{ host, port, user, password, name string }

func parseDatabaseURL(s string) (database, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return database{}, fmt.Errorf("DatabaseURL %q is not postgres://user@host:port/database", redact(s))
	}
	db := database{host: u.Hostname(), port: cmp.Or(u.Port(), "5432"), name: strings.TrimPrefix(u.Path, "/")}
	if u.User != nil {
		db.user = u.User.Username()
		db.password, _ = u.User.Password()
	}
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

// ConnectorConfig returns the connector's configuration, as Connect's REST API takes it
// (PUT /connectors/<name>/config), with config's defaults applied. It fails if config is
// invalid.
//
// What it sets: one task (a slot has one reader), pgoutput with the publication Prepare
// creates (publication.autocreate.mode=disabled: the default needs a superuser),
// snapshot.mode=no_data (the connector starts at its slot's position; rows committed before
// were for the Relay), exactly-once required, a low poll interval, heartbeats, the raw payload
// as the record value (BinaryDataConverter) and the router: topic = destination column,
// record key = partition_key, header "id" = uuid, header "metadata" = the metadata JSON.
// Deletes are ignored (an outbox row deleted by retention is not an event).
func ConnectorConfig(config Config) (map[string]string, error) {
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
