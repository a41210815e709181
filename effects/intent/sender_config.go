package intent

import (
	"cmp"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// Defaults of SenderConfig and Channel.
const (
	defaultWorkers      = 1
	defaultLease        = 2 * time.Minute
	defaultSendTimeout  = 30 * time.Second
	defaultPollInterval = time.Second
	defaultBackoff      = time.Second
	defaultMaxBackoff   = 5 * time.Minute
	defaultMaxAttempts  = 5
)

// maxWorkers bounds SenderConfig.Workers.
const maxWorkers = 1024

// Channel configures one channel of a Sender.
type Channel struct {
	// Provider performs the effect. Required.
	Provider Provider
	// OnCrash decides about intents whose outcome is unknown. See CrashPolicy.
	OnCrash CrashPolicy
	// MaxAttempts is how often a sender may take an intent before it becomes FAILED. Default 5.
	MaxAttempts int
}

// SenderConfig configures a Sender.
type SenderConfig struct {
	// Schema holds the intents table. Default pgtx.DefaultSchema.
	Schema string
	// Channels maps channel names to their providers and policies. Intents of channels not
	// listed here are left alone (another Sender may own them). At least one is required.
	Channels map[string]Channel
	// Workers is the number of intents sent at once by Run. Default 1, at most
	// 1024. Each holds a database connection only for the short claim and finish
	// statements, not during the provider call.
	Workers int
	// Lease is how long a claimed intent stays SENDING before other senders take it for
	// crashed. Default 2 minutes. A sender that stops cleanly ends the lease of
	// its intent at once (see Sender.Close).
	Lease time.Duration
	// SendTimeout bounds each Send and Lookup. It must be below Lease. Default
	// 30 seconds, or half the Lease when that is shorter.
	SendTimeout time.Duration
	// PollInterval is the wait after finding nothing to send. Default 1 second.
	PollInterval time.Duration
	// Backoff is the delay before the second attempt of an intent, and the first wait after a
	// database error; it doubles per attempt up to MaxBackoff, each delay drawn between half and
	// all of that value (jitter). Defaults 1 second and 5
	// minutes (or Backoff when that is longer).
	Backoff    time.Duration
	MaxBackoff time.Duration
	// TracerProvider traces every take of an intent (see Tracing in the package doc). Default
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *SenderConfig) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.Workers = cmp.Or(c.Workers, defaultWorkers)
	c.Lease = cmp.Or(c.Lease, defaultLease)
	c.SendTimeout = cmp.Or(c.SendTimeout, min(defaultSendTimeout, c.Lease/2))
	c.PollInterval = cmp.Or(c.PollInterval, defaultPollInterval)
	c.Backoff = cmp.Or(c.Backoff, defaultBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, max(defaultMaxBackoff, c.Backoff))
	for name, ch := range c.Channels {
		ch.MaxAttempts = cmp.Or(ch.MaxAttempts, defaultMaxAttempts)
		if ch.OnCrash == PolicyDefault {
			if _, ok := ch.Provider.(Lookuper); ok {
				ch.OnCrash = Reconcile
			}
		}
		c.Channels[name] = ch
	}
}

// Validate reports what to fix in a configuration.
func (c SenderConfig) Validate() error {
	errs := []error{
		pgtx.ValidateIdentifier("schema", c.Schema),
		setup.Between("Workers", c.Workers, 1, maxWorkers),
	}
	if len(c.Channels) == 0 {
		errs = append(errs, errors.New("Channels is empty: configure at least one channel with its Provider"))
	}
	names := make([]string, 0, len(c.Channels))
	for name := range c.Channels {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ch := c.Channels[name]
		if err := validateChannel(name); err != nil {
			errs = append(errs, fmt.Errorf("channel %q: %w", name, err))
		}
		if ch.Provider == nil {
			errs = append(errs, fmt.Errorf("channel %q: Provider is nil", name))
			continue
		}
		_, canLookup := ch.Provider.(Lookuper)
		switch ch.OnCrash {
		case PolicyDefault:
			errs = append(errs, fmt.Errorf("channel %q: its provider cannot look sends up (it does not implement intent.Lookuper), so choose OnCrash: Resend (a crash mid-call may send twice unless the provider honours the idempotency key) or Skip (a crash mid-call may lose the send)", name))
		case Reconcile:
			if !canLookup {
				errs = append(errs, fmt.Errorf("channel %q: OnCrash is Reconcile but the provider does not implement intent.Lookuper; implement Lookup or choose Resend or Skip", name))
			}
		case Resend, Skip:
		default:
			errs = append(errs, fmt.Errorf("channel %q: unknown OnCrash %v", name, ch.OnCrash))
		}
		if err := setup.AtLeast("MaxAttempts", ch.MaxAttempts, 1); err != nil {
			errs = append(errs, fmt.Errorf("channel %q: %w", name, err))
		}
	}
	if c.Lease <= 0 || c.SendTimeout <= 0 || c.PollInterval <= 0 || c.Backoff <= 0 || c.MaxBackoff < c.Backoff {
		errs = append(errs, errors.New("Lease, SendTimeout, PollInterval and Backoff must be positive and MaxBackoff >= Backoff"))
	} else if c.SendTimeout >= c.Lease {
		errs = append(errs, fmt.Errorf("SendTimeout (%s) must be below Lease (%s): otherwise a slow but live sender is taken for crashed and its intent is sent twice", c.SendTimeout, c.Lease))
	}
	return errors.Join(errs...)
}
