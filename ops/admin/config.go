package admin

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// Defaults of Config.
const (
	DefaultQueryTimeout   = 10 * time.Second
	DefaultSampleInterval = 15 * time.Second
)

// Config configures the admin handler.
type Config struct {
	// Schema holds watermill-once's tables. Default pgtx.DefaultSchema.
	Schema string
	// AllowWrites enables the writes: replay and skip (POST /api/inbox/replay and
	// /api/inbox/skip), republishing rejected outbox rows and forgetting a retired relay (POST
	// /api/outbox/republish and /api/outbox/forget). Default false: the handler only reads, and
	// writes are answered 403.
	AllowWrites bool
	// Middlewares are effectively-once middlewares running in this process: their in-process
	// counts (fresh, duplicates, failures) give each consumer its duplicate rate in GET
	// /api/consumers. Optional: the charts need none (duplicates per minute are in the
	// database).
	Middlewares []*once.Middleware
	// QueryTimeout bounds the database work of one request, and of one sample. Default
	// DefaultQueryTimeout (10s).
	QueryTimeout time.Duration
	// SampleInterval is how often the handler samples the inbox backlog and the relays' lag
	// into its in-memory history (GET /api/history). Default
	// DefaultSampleInterval (15s); a negative value turns background sampling off
	// (Handler.Sample still takes one). At least 1s.
	SampleInterval time.Duration
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, DefaultQueryTimeout)
	c.SampleInterval = cmp.Or(c.SampleInterval, DefaultSampleInterval)
}

// Validate reports what to fix in a configuration.
func (c Config) Validate() error {
	errs := []error{
		pgtx.ValidateIdentifier("schema", c.Schema),
		setup.NotNegative("QueryTimeout", c.QueryTimeout),
	}
	if c.SampleInterval > 0 && c.SampleInterval < time.Second {
		errs = append(errs, fmt.Errorf("SampleInterval must be at least 1s (or negative to turn sampling off), got %s", c.SampleInterval))
	}
	return errors.Join(errs...)
}
