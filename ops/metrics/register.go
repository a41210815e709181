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
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

const defaultScrapeTimeout = 5 * time.Second

// Sources are the components whose figures are exported; nil and empty fields are skipped.
// Relays are labelled by name, inbox components by consumer; Senders and HTTPIdempotency are
// summed without a label.
type Sources struct {
	// DB (nil: no database gauges) and Schema (default pgtx.DefaultSchema) feed the gauges
	// read at scrape time, within ScrapeTimeout (default 5s).
	DB            *sql.DB
	Schema        string
	ScrapeTimeout time.Duration

	Middlewares     []*once.Middleware
	Relays          []*outbox.Relay
	Processors      []*inbox.Processor
	Receivers       []*inbox.Receiver
	Janitors        []*retention.Janitor
	Senders         []*intent.Sender
	HTTPIdempotency []*httpidem.Middleware

	// Logger receives scrape errors. Default: none (they are still counted).
	Logger watermill.LoggerAdapter
}

// Register builds one collector over src and registers it with reg. It fails if reg already
// has metrics of these names: build a single Sources with every component of the process.
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
	if err := setup.NotNegative("ScrapeTimeout", src.ScrapeTimeout); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	src.Logger = setup.Logger(src.Logger)
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
