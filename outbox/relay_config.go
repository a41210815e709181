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

// MaxPublishLanes is the largest PublishLanes accepted.
const MaxPublishLanes = 256

// maxBatchSize is the largest BatchSize accepted.
const maxBatchSize = 10000

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Schema holds the outbox tables. Default pgtx.DefaultSchema.
	Schema string
	// Name identifies this relay's position in outbox_offsets (a consumer group). Relays with
	// the same name share one position and elect one active instance; relays with different
	// names each forward every row of their Source (e.g. one to Kafka, one to an audit sink).
	// A name serves one Source: a relay whose Source differs from the one its name was
	// registered with refuses to run (ErrRelaySource). It cannot start with
	// "cdc:" (the positions of replication slots). Default "relay".
	Name string
	// Source selects the rows this relay forwards: those whose Writer had the same
	// Config.Source. Rows of other sources are passed over (RelayCounters.OtherSource), left to
	// the relays of their own source, so that services sharing one database and schema each
	// forward their own messages only. Default "": rows written without a source (every row
	// written before migration 012). Rows of a source no relay serves are kept by Prune, and
	// every relay that passes over them logs that at error level.
	Source string
	// BatchSize is the most rows read and published per batch (a round of the relay's order,
	// see the package doc, spans as many batches as it needs), at most 10000. Each batch also
	// reads and writes the position (a commit of its own), so small batches cost throughput:
	// measured with go run ./e2e/bench, 1000 forwards 2.5-3.4x more messages per second than
	// 100 to Kafka, RabbitMQ and SQL alike. After a crash, at most one batch is published
	// again. Default 1000.
	BatchSize int
	// PollInterval is the fallback wait of an idle relay. The active relay LISTENs on the
	// schema's channel, and while it is idle the Writer notifies it at every commit that stores
	// messages (package doc, Waking up), so it wakes when they commit. Polling covers only what
	// a notification cannot: a LISTEN connection being re-established or dropped silently, a
	// transaction that stored its rows just as the relay went idle, a row inserted by something
	// other than the Writer, and LISTEN being off (DisableListen, or a *sql.DB whose driver is
	// not pgx's stdlib: then set it lower). An idle relay sends two statements per
	// PollInterval. Default 1s.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off: the relay then only polls, reading again at once
	// after every round that published and waiting PollInterval after an empty one, and
	// Writers are never asked to notify it.
	DisableListen bool
	// Backoff is the first wait after a failed publish or database error; it doubles up
	// to MaxBackoff, each wait drawn between half and all of that value (jitter). Default
	// 100ms and 5s.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// StandbyInterval is how often a relay that is not the active one tries to take over.
	// Default 1s.
	StandbyInterval time.Duration

	// PublishLanes > 1 publishes each batch over that many concurrent Publish calls, one per
	// lane, to publishers that gain from concurrency: watermill-kafka's own publisher sends one
	// message per request and waits for it, but concurrent calls are batched by its producer
	// (the broker package's Kafka publisher already sends a call's messages together).
	// Messages are assigned to lanes by LaneKey, and each lane publishes its messages in the
	// relay's order (see the package doc, Order), so messages with the same key keep their
	// order; messages with different keys may reach the broker in another order. The position
	// still advances only after every lane of the batch has published. At most
	// MaxPublishLanes. Default 1: one Publish call per run of rows with
	// the same topic, in the relay's order.
	PublishLanes int
	// LaneKey returns the ordering key of a message for PublishLanes. Default: the
	// "partition_key" metadata (the broker package's Kafka partition key), else the UUID.
	// Use the key that decides your broker's partition or queue, so that what the broker keeps
	// in order is published in order.
	LaneKey func(topic string, msg *message.Message) string

	// IsPermanent tells a publish error that refuses the messages for good (publishing the
	// same message again cannot succeed: an invalid topic, a message too large, metadata the
	// broker reserves) from a transient one. A message refused for good is set aside in
	// outbox_rejected with the error, for an operator to republish (RepublishRejected), and
	// the relay goes on with the rows behind it; when a call of several messages is refused
	// for good, they are published again one by one to find which. Default
	// wmonce.IsPermanent: the errors a publisher marked with wmonce.Permanent, as the
	// broker package's publishers mark the refusals they recognise (for another publisher,
	// pass broker.IsPermanentPublishError or your own). Whatever it says, a cancelled
	// context, a timeout and a connection error are never permanent.
	IsPermanent func(err error) bool

	// TracerProvider traces publishing: each message that carries trace context (stamped by
	// the Writer) is published under an "outbox relay publish" span (kind producer), a child
	// of and linked to the producer's span, one per publish attempt (a failed attempt ends
	// its span with the error; a held row's next attempt starts another), and set in the message's
	// context, so a tracing publisher decorator nests under it. The message's metadata keeps
	// the producer's context, so the consumer continues that trace. Messages without trace
	// context are published untraced. Default otel.GetTracerProvider().
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
	errs := []error{
		pgtx.ValidateIdentifier("schema", c.Schema),
		setup.CheckName("relay Name", c.Name),
		checkRelayNotSlotPosition(c.Name),
		checkSource(c.Source),
		setup.Between("BatchSize", c.BatchSize, 1, maxBatchSize),
		setup.Between("PublishLanes", c.PublishLanes, 1, MaxPublishLanes),
	}
	if c.PollInterval < 0 || c.Backoff < 0 || c.MaxBackoff < c.Backoff || c.StandbyInterval < 0 {
		errs = append(errs, errors.New("intervals must be positive and MaxBackoff >= Backoff"))
	}
	return errors.Join(errs...)
}
