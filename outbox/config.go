package outbox

import (
	"cmp"
	"errors"
	"fmt"
	"time"
	"unicode"

	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// Config configures a Writer.
type Config struct {
	// Schema holds the outbox table (see package migrate). Default pgtx.DefaultSchema.
	Schema string
	// ValidateTopic checks destination topics when messages are stored, so that a topic the
	// broker would refuse fails the producing transaction instead of blocking the relay later.
	// Default DefaultValidateTopic. The broker package offers stricter, broker-specific ones.
	ValidateTopic func(topic string) error
	// Now stamps occurred_at. Default time.Now.
	Now func() time.Time
	// Source names the service that writes these messages, stamped on each row (the outbox's
	// source column, migration 012). A Relay forwards only the rows of its own
	// RelayConfig.Source, so services that share one database and schema each forward their own
	// messages and never each other's. Give every Writer of a service the same Source,
	// including the ones the middleware and the inbox processor use (pass this Writer as their
	// Config.Outbox): a component that builds its own Writer stores rows without a source.
	// Default "": rows without a source, forwarded by relays without one (as every row written
	// before migration 012).
	Source string
	// PartitionKeyField is the metadata field whose value the Writer stores in the outbox's
	// partition_key column (migration 013), the record key Debezium's Outbox Event Router gives
	// the event: events of one key land on one Kafka partition, in commit order. A message
	// without it is keyed by its UUID. Give it the value of the broker's
	// Kafka.PartitionKeyField, so that the Relay and Debezium key the same events alike.
	// Default "partition_key".
	PartitionKeyField string
	// TracerProvider traces PublishTx: an "outbox store" span under the caller's span (none
	// when the caller's context holds no span). Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.PartitionKeyField = cmp.Or(c.PartitionKeyField, defaultPartitionKeyField)
	if c.ValidateTopic == nil {
		c.ValidateTopic = DefaultValidateTopic
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	return errors.Join(pgtx.ValidateIdentifier("schema", c.Schema), checkSource(c.Source))
}

// checkSource applies the rule of every name (setup.CheckName) to a non-empty Source.
func checkSource(source string) error {
	if source == "" {
		return nil
	}
	return setup.CheckName("Source", source)
}

// maxTopicLength is the longest topic DefaultValidateTopic accepts, in bytes: Kafka's limit.
const maxTopicLength = 249

// DefaultValidateTopic accepts 1 to 249 bytes of printable UTF-8 without spaces: a name every
// supported broker can carry (Kafka refuses more than 249 bytes).
func DefaultValidateTopic(topic string) error {
	if topic == "" {
		return errors.New("topic is empty")
	}
	if len(topic) > maxTopicLength {
		return fmt.Errorf("topic %.40q... is %d bytes long; the limit is %d", topic, len(topic), maxTopicLength)
	}
	if err := setup.CheckText("topic", topic); err != nil {
		return err
	}
	for _, r := range topic {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("topic %q contains a space or control character", topic)
		}
	}
	return nil
}
