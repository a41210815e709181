package retention

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// Defaults of Config (ops/doctor and the CLI fall back to them).
const (
	DefaultKeep            = 7 * 24 * time.Hour
	DefaultInboxKeep       = 7 * 24 * time.Hour
	DefaultOutboxKeep      = 24 * time.Hour
	DefaultBatchSize       = 5000
	defaultPollInterval    = time.Minute
	defaultPartitionsAhead = 3
	maxPartitionsAhead     = 366
)

// Limits enforced by Validate: MinKeep, the shortest window of dedupe records (shorter is a
// unit mistake that forgets keys before a broker redelivers), and MaxBatchSize.
const (
	MinKeep      = time.Minute
	MaxBatchSize = 100000
)

// Policy is the retention of one consumer's dedupe records (claims, finished inbox rows).
type Policy struct {
	// Keep: a record older than this is deleted. Zero in Consumers: Default.Keep; in Default:
	// DefaultKeep (7 days). At least MinKeep.
	Keep time.Duration
	// RedeliveryHorizon is the longest a copy can arrive after its original (broker retention,
	// dead-letter redrives, replays), as declared; 0 undeclared. A shorter Keep is warned of.
	RedeliveryHorizon time.Duration
}

// Config configures a Janitor. Zero "...Keep" fields that have no default leave their table
// alone.
type Config struct {
	// Schema holds watermill-once's tables. Default pgtx.DefaultSchema.
	Schema string
	// Default is the policy of every consumer not listed in Consumers; a listed consumer's
	// policy covers all its dedupe records (claims and finished inbox rows).
	Default   Policy
	Consumers map[string]Policy
	// InboxKeep is how long unlisted consumers' finished inbox rows are kept (listed ones:
	// their Policy.Keep). Default 7 days.
	InboxKeep time.Duration
	// OutboxKeep is how long outbox rows are kept once every relay forwarded them. Default 24h.
	OutboxKeep time.Duration
	// CDCSlots names Debezium replication slots whose outbox positions must be registered;
	// each round first advances every registered slot position (cdc.AdvancePosition).
	CDCSlots []string
	// HTTPKeysKeep deletes stored httpidem responses older than this (at least its Retention).
	HTTPKeysKeep time.Duration
	// OutboxRejectedKeep deletes older rejected outbox rows (each the only copy of a message).
	OutboxRejectedKeep time.Duration
	// SentIntentsKeep deletes SENT intents confirmed longer ago (intent.PruneSent); keep it at
	// least the Keep of the consumers that record intents.
	SentIntentsKeep time.Duration
	// BatchSize is the most rows one delete transaction removes. Default 5000, at most 100000.
	BatchSize int
	// PollInterval is the time between rounds of Run and between a standby's tries to take
	// over. Default 1 minute.
	PollInterval time.Duration
	// PartitionsAhead is how many days of processed_messages_daily partitions are created
	// ahead once the table has one. Default 3, at most 366; negative: none.
	PartitionsAhead int
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	c.Default.Keep = cmp.Or(c.Default.Keep, DefaultKeep)
	if len(c.Consumers) > 0 {
		consumers := make(map[string]Policy, len(c.Consumers))
		for name, p := range c.Consumers {
			p.Keep = cmp.Or(p.Keep, c.Default.Keep)
			consumers[name] = p
		}
		c.Consumers = consumers
	}
	c.InboxKeep = cmp.Or(c.InboxKeep, DefaultInboxKeep)
	c.OutboxKeep = cmp.Or(c.OutboxKeep, DefaultOutboxKeep)
	c.CDCSlots = slices.Clone(c.CDCSlots)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, defaultPollInterval)
	c.PartitionsAhead = cmp.Or(c.PartitionsAhead, defaultPartitionsAhead)
}

// Validate reports what to fix in a configuration; zero values that have defaults are
// accepted (NewJanitor fills them in first).
func (c Config) Validate() error {
	errs := []error{
		pgtx.ValidateIdentifier("schema", cmp.Or(c.Schema, pgtx.DefaultSchema)),
		c.Default.validate("Default"),
		checkKeep("InboxKeep", c.InboxKeep),
		setup.NotNegative("OutboxKeep", c.OutboxKeep),
		checkOptionalKeep("HTTPKeysKeep", c.HTTPKeysKeep),
		checkOptionalKeep("OutboxRejectedKeep", c.OutboxRejectedKeep),
		checkOptionalKeep("SentIntentsKeep", c.SentIntentsKeep),
		setup.Check(c.BatchSize >= 0 && c.BatchSize <= MaxBatchSize, "BatchSize must be between 1 and %d (0 = %d), got %d", MaxBatchSize, DefaultBatchSize, c.BatchSize),
		setup.Check(c.PollInterval >= 0, "PollInterval must not be negative (0 = %s), got %s", defaultPollInterval, c.PollInterval),
		setup.Check(c.PartitionsAhead <= maxPartitionsAhead, "PartitionsAhead must be at most %d days, got %d", maxPartitionsAhead, c.PartitionsAhead),
	}
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		field := fmt.Sprintf("Consumers[%q]", name)
		if err := validateConsumer(name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
		errs = append(errs, c.Consumers[name].validate(field))
	}
	for i, slot := range c.CDCSlots {
		if err := pgtx.ValidateIdentifier("slot", slot); err != nil {
			errs = append(errs, fmt.Errorf("CDCSlots[%d]: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// validate reports what to fix in the policy that field names.
func (p Policy) validate(field string) error {
	return errors.Join(checkKeep(field+".Keep", p.Keep),
		setup.Check(p.RedeliveryHorizon >= 0, "%s.RedeliveryHorizon must not be negative (0 = undeclared), got %s", field, p.RedeliveryHorizon))
}

// checkKeep refuses a window of dedupe records below MinKeep (0 is accepted: it takes a
// default).
func checkKeep(field string, d time.Duration) error {
	return setup.Check(d == 0 || d >= MinKeep, "%s is %s: it must be at least %s (a shorter window forgets keys before a broker can redeliver; time.Duration counts nanoseconds)", field, d, MinKeep)
}

// checkOptionalKeep refuses a window of a table pruned only on request below a second
// (0 is off).
func checkOptionalKeep(field string, d time.Duration) error {
	return setup.Check(d == 0 || d >= time.Second, "%s must be 0 (off) or at least 1s, got %s", field, d)
}

// validateConsumer applies setup.CheckName, the rule every component applies to names.
func validateConsumer(name string) error { return setup.CheckName("consumer name", name) }

// policy returns the policy that applies to consumer's claims.
func (c Config) policy(consumer string) Policy {
	if p, ok := c.Consumers[consumer]; ok {
		return p
	}
	return c.Default
}

// inboxKeep returns how long consumer's finished inbox rows are kept.
func (c Config) inboxKeep(consumer string) time.Duration {
	if p, ok := c.Consumers[consumer]; ok {
		return p.Keep
	}
	return c.InboxKeep
}

// longestKeep is the window past which a day of processed_messages_daily is expired for every
// consumer: the table is shared, so a day can only go when no consumer still needs it.
func (c Config) longestKeep() time.Duration {
	longest := c.Default.Keep
	for _, p := range c.Consumers {
		longest = max(longest, p.Keep)
	}
	return longest
}

// warnings lists, in a stable order, every window shorter than its declared redelivery horizon.
func (c Config) warnings() []string {
	var out []string
	d := c.Default
	if d.RedeliveryHorizon > 0 && d.Keep < d.RedeliveryHorizon {
		out = append(out, fmt.Sprintf("retention of claims of unlisted consumers (Default.Keep %s) is shorter than their declared redelivery horizon (%s): a copy redelivered after its key is deleted would be applied twice (or refused by the age guard); raise Default.Keep above %s",
			d.Keep, d.RedeliveryHorizon, d.RedeliveryHorizon))
	}
	if d.RedeliveryHorizon > 0 && c.InboxKeep < d.RedeliveryHorizon {
		out = append(out, fmt.Sprintf("retention of finished inbox rows of unlisted consumers (InboxKeep %s) is shorter than their declared redelivery horizon (%s): a copy redelivered after its row is deleted would be stored and processed again; raise InboxKeep above %s",
			c.InboxKeep, d.RedeliveryHorizon, d.RedeliveryHorizon))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		p := c.Consumers[name]
		if p.RedeliveryHorizon > 0 && p.Keep < p.RedeliveryHorizon {
			out = append(out, fmt.Sprintf("retention of consumer %q (Keep %s) is shorter than its declared redelivery horizon (%s): a copy redelivered after its key is deleted would be applied twice (or refused by the age guard); raise Consumers[%q].Keep above %s",
				name, p.Keep, p.RedeliveryHorizon, name, p.RedeliveryHorizon))
		}
	}
	return out
}
