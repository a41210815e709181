package metrics

import (
	"cmp"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

const defaultScrapeTimeout = 5 * time.Second

// Sources are the components whose figures are exported. Nil and empty fields are skipped.
type Sources struct {
	// DB and Schema feed the gauges read from the database at scrape time: inbox rows per
	// status and oldest pending age (every consumer in the inbox table), outbox backlog and lag
	// per relay, rejected outbox rows; with Senders, unfinished intents per channel; with
	// HTTPIdempotency, the stored keys. Nil DB: no database gauges. Schema default
	// pgtx.DefaultSchema.
	DB     *sql.DB
	Schema string
	// ScrapeTimeout bounds those queries. Default 5s.
	ScrapeTimeout time.Duration

	// Middlewares export claims, duplicates, fingerprint mismatches, handler outcomes and
	// transaction retries per consumer (and sender), and group-commit totals.
	Middlewares []*once.Middleware
	// Relays export forwarded, failed, rejected and fenced counts and leadership, labelled
	// with the relay's name when *outbox.Relay has a Name() method (see the package doc).
	Relays []*outbox.Relay
	// Processors export the inbox processors' counts, labelled with the consumer when
	// *inbox.Processor has a Consumer() method.
	Processors []*inbox.Processor
	// Receivers export what the inbox receivers stored, labelled with the consumer when
	// *inbox.Receiver has a Consumer() method.
	Receivers []*inbox.Receiver
	// Janitors export deletions, rounds, leadership and retention warnings.
	Janitors []*retention.Janitor
	// Senders export the intent senders' counts (summed over the Senders) and, with a DB,
	// the unfinished intents per channel of the intents table.
	Senders []*intent.Sender
	// HTTPIdempotency exports the Idempotency-Key middlewares' request outcomes (summed) and,
	// with a DB, the stored keys of http_idempotency_keys.
	HTTPIdempotency []*httpidem.Middleware

	// Logger receives scrape errors. Default: none (they are still counted).
	Logger watermill.LoggerAdapter
}

// Register builds one collector over src and registers it with reg. Counters are read from
// the components' atomic totals and database gauges are queried when reg is gathered, so
// nothing is added to the message path. Register fails if reg already has metrics of these
// names: build a single Sources with every component of the process.
func Register(reg prometheus.Registerer, src Sources) error {
	if reg == nil {
		return errors.New("metrics: registerer is nil: pass prometheus.DefaultRegisterer or a prometheus.NewRegistry()")
	}
	c, err := NewCollector(src)
	if err != nil {
		return err
	}
	if err := reg.Register(c); err != nil {
		return fmt.Errorf("metrics: register: %w", err)
	}
	return nil
}

// NewCollector returns the collector Register registers, for callers that wrap or combine
// collectors themselves.
func NewCollector(src Sources) (prometheus.Collector, error) {
	src.Schema = cmp.Or(src.Schema, pgtx.DefaultSchema)
	src.ScrapeTimeout = cmp.Or(src.ScrapeTimeout, defaultScrapeTimeout)
	if err := pgtx.ValidateIdentifier("schema", src.Schema); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if src.ScrapeTimeout < 0 {
		return nil, fmt.Errorf("metrics: ScrapeTimeout must not be negative, got %s", src.ScrapeTimeout)
	}
	if src.Logger == nil {
		src.Logger = watermill.NopLogger{}
	}
	c := &collector{src: src, inboxConsumers: map[string]bool{}, intentChannels: map[string]bool{}}
	if src.DB != nil {
		ops, err := inbox.NewOps(src.DB, inbox.OpsConfig{Schema: src.Schema}, src.Logger)
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		c.ops = ops
		if len(src.Senders) > 0 {
			if c.intents, err = intent.NewStore(src.DB, intent.StoreConfig{Schema: src.Schema}); err != nil {
				return nil, fmt.Errorf("metrics: %w", err)
			}
		}
	}
	return c, nil
}
