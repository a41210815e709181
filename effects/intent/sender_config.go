package intent

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	// OnCrash decides about intents whose outcome is unknown.
	OnCrash CrashPolicy
	// MaxAttempts is how often an intent may be taken before it becomes FAILED. Default 5.
	MaxAttempts int
}

// SenderConfig configures a Sender.
type SenderConfig struct {
	// Schema holds the intents table. Default pgtx.DefaultSchema.
	Schema string
	// Channels maps channel names to their providers and policies; at least one. Intents of
	// other channels are left alone (another Sender may own them).
	Channels map[string]Channel
	// Workers is the number of intents Run sends at once: 1 (default) to 1024.
	Workers int
	// Lease is how long a claimed intent stays SENDING before other senders take it for
	// crashed. Default 2 minutes.
	Lease time.Duration
	// SendTimeout bounds each Send and Lookup; below Lease. Default 30s, or Lease/2 if shorter.
	SendTimeout time.Duration
	// PollInterval is the wait after finding nothing to send. Default 1 second.
	PollInterval time.Duration
	// Backoff (default 1s) is the delay before an intent's second attempt and after a database
	// error, doubling up to MaxBackoff (default 5 minutes, at least Backoff), with jitter.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// TracerProvider traces every take of an intent. Default otel.GetTracerProvider().
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
		setup.Check(len(c.Channels) > 0, "Channels is empty: configure at least one channel with its Provider"),
		setup.Positive("Lease", c.Lease),
		setup.Positive("SendTimeout", c.SendTimeout),
		setup.Positive("PollInterval", c.PollInterval),
		setup.Positive("Backoff", c.Backoff),
		setup.AtLeast("MaxBackoff", c.MaxBackoff, c.Backoff),
		setup.Check(c.SendTimeout < c.Lease, "SendTimeout (%s) must be below Lease (%s): otherwise a slow but live sender is taken for crashed and its intent is sent twice", c.SendTimeout, c.Lease),
	}
	for _, name := range slices.Sorted(maps.Keys(c.Channels)) {
		if err := c.Channels[name].validate(name); err != nil {
			errs = append(errs, fmt.Errorf("channel %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// validate reports what to fix in the channel called name.
func (ch Channel) validate(name string) error {
	if ch.Provider == nil {
		return errors.Join(validateChannel(name), errors.New("Provider is nil"))
	}
	return errors.Join(validateChannel(name), ch.checkPolicy(), setup.AtLeast("MaxAttempts", ch.MaxAttempts, 1))
}

// checkPolicy reports an OnCrash that the channel's provider cannot serve, or none chosen where
// the provider cannot look sends up.
func (ch Channel) checkPolicy() error {
	_, canLookup := ch.Provider.(Lookuper)
	switch ch.OnCrash {
	case PolicyDefault:
		return errors.New("its provider cannot look sends up (it does not implement intent.Lookuper), so choose OnCrash: Resend (a crash mid-call may send twice unless the provider honours the idempotency key) or Skip (a crash mid-call may lose the send)")
	case Reconcile:
		return setup.Check(canLookup, "OnCrash is Reconcile but the provider does not implement intent.Lookuper; implement Lookup or choose Resend or Skip")
	case Resend, Skip:
		return nil
	}
	return fmt.Errorf("unknown OnCrash %v", ch.OnCrash)
}
