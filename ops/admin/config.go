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
	defaultQueryTimeout   = 10 * time.Second
	defaultSampleInterval = 15 * time.Second
)

// Config configures the admin handler.
type Config struct {
	// Schema holds watermill-once's tables. Default pgtx.DefaultSchema.
	Schema string
	// AllowWrites enables the writes (replay, skip, republish, forget, failure-group actions).
	// Default false: they are answered 403.
	AllowWrites bool
	// Middlewares running in this process give each consumer its duplicate rate (their
	// in-process counts). Optional: the charts need none.
	Middlewares []*once.Middleware
	// QueryTimeout bounds the database work of one request, and of one sample. Default 10s.
	QueryTimeout time.Duration
	// SampleInterval is how often the charts' backlog and lag are sampled. Default 15s, at
	// least 1s; negative turns background sampling off (Handler.Sample still takes one).
	SampleInterval time.Duration
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, defaultQueryTimeout)
	c.SampleInterval = cmp.Or(c.SampleInterval, defaultSampleInterval)
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
