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
	// ValidateTopic checks topics when messages are stored, so that a topic the broker would refuse
	// fails the producer's transaction, not the relay. Default DefaultValidateTopic.
	ValidateTopic func(topic string) error
	// Now stamps occurred_at. Default time.Now.
	Now func() time.Time
	// Source names the service, stamped on each row: a Relay forwards only the rows of its own
	// RelayConfig.Source. Give the middleware and the inbox Processor this Writer (their
	// Config.Outbox). Default "": rows without a source (as before migration 012).
	Source string
	// PartitionKeyField is the metadata field stored as the row's partition_key, Debezium's
	// record key (else the UUID); use the broker's Kafka.PartitionKeyField. Default "partition_key".
	PartitionKeyField string
	// TracerProvider traces PublishTx ("outbox store" spans). Default otel.GetTracerProvider().
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

// DefaultValidateTopic accepts 1 to 249 bytes of printable UTF-8 without spaces, which every
// supported broker carries.
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
