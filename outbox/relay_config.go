package outbox

import (
	"cmp"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// The RelayConfig defaults (its field docs state them).
const (
	defaultRelayName       = "relay"
	defaultBatchSize       = 1000
	defaultPollInterval    = time.Second
	defaultBackoff         = 100 * time.Millisecond
	defaultMaxBackoff      = 5 * time.Second
	defaultStandbyInterval = time.Second
	defaultPublishLanes    = 1
)

// defaultLaneKeyField is the metadata field the default LaneKey reads; it is the broker
// package's default Kafka partition key field.
const defaultLaneKeyField = "partition_key"

// maxPublishLanes is the largest PublishLanes accepted.
const maxPublishLanes = 256

// maxBatchSize is the largest BatchSize accepted.
const maxBatchSize = 10000

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Schema holds the outbox tables. Default pgtx.DefaultSchema.
	Schema string
	// Name is the relay's position in outbox_offsets: relays of one name share it and elect
	// one active instance; relays of different names each forward every row of their Source.
	// A name serves one Source (else ErrRelaySource) and cannot start with "cdc:". Default
	// "relay".
	Name string
	// Source selects the rows whose Writer had the same Config.Source; others are passed over
	// (RelayCounters.OtherSource). Default "": rows written without a source.
	Source string
	// BatchSize is the most rows read and published per batch, 1 to 10000: after a crash at
	// most one batch goes out again; small batches cost throughput. Default 1000.
	BatchSize int
	// PollInterval is the fallback wait of an idle relay, which otherwise wakes on the Writers'
	// notifications; an idle relay sends two statements per PollInterval. Default 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: the relay only polls.
	DisableListen bool
	// Backoff is the first wait after a failed publish or database error, doubling up to
	// MaxBackoff, with jitter. Default 100ms and 5s.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// StandbyInterval is how often a standby tries to take over. Default 1s.
	StandbyInterval time.Duration

	// PublishLanes > 1 publishes each batch over that many concurrent Publish calls (at most
	// 256), keeping the relay's order per LaneKey only. Default 1.
	PublishLanes int
	// LaneKey returns a message's ordering key for PublishLanes: use what decides the broker's
	// partition or queue. Default the "partition_key" metadata, else the UUID.
	LaneKey func(topic string, msg *message.Message) string

	// IsPermanent tells a publish error that refuses a message for good (it is set aside in
	// outbox_rejected) from a transient one (its topic is held); a cancelled context, a timeout
	// and a connection error are never permanent. Default wmonce.IsPermanent (the broker
	// package's publishers mark their refusals; else use broker.IsPermanentPublishError).
	IsPermanent func(err error) bool

	// TracerProvider traces publishing ("outbox relay publish" spans, one per attempt).
	// Default otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func defaultLaneKey(_ string, msg *message.Message) string {
	if v := msg.Metadata.Get(defaultLaneKeyField); v != "" {
		return v
	}
	return msg.UUID
}

func (c *RelayConfig) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.Name = cmp.Or(c.Name, defaultRelayName)
	c.BatchSize = cmp.Or(c.BatchSize, defaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, defaultPollInterval)
	c.Backoff = cmp.Or(c.Backoff, defaultBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, defaultMaxBackoff)
	c.StandbyInterval = cmp.Or(c.StandbyInterval, defaultStandbyInterval)
	c.PublishLanes = cmp.Or(c.PublishLanes, defaultPublishLanes)
	if c.LaneKey == nil {
		c.LaneKey = defaultLaneKey
	}
	if c.IsPermanent == nil {
		c.IsPermanent = wmonce.IsPermanent
	}
}

// Validate reports a configuration that cannot work.
func (c RelayConfig) Validate() error {
	return errors.Join(
		pgtx.ValidateIdentifier("schema", c.Schema),
		setup.CheckName("relay Name", c.Name),
		checkRelayNotSlotPosition(c.Name),
		checkSource(c.Source),
		setup.Between("BatchSize", c.BatchSize, 1, maxBatchSize),
		setup.Between("PublishLanes", c.PublishLanes, 1, maxPublishLanes),
		setup.NotNegative("PollInterval", c.PollInterval),
		setup.NotNegative("Backoff", c.Backoff),
		setup.AtLeast("MaxBackoff", c.MaxBackoff, c.Backoff),
		setup.NotNegative("StandbyInterval", c.StandbyInterval),
	)
}
