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

// Defaults of Config.
const (
	DefaultKeep            = 7 * 24 * time.Hour
	DefaultInboxKeep       = 7 * 24 * time.Hour
	DefaultOutboxKeep      = 24 * time.Hour
	DefaultBatchSize       = 5000
	defaultPollInterval    = time.Minute
	defaultPartitionsAhead = 3
)

// Limits enforced by Validate.
const (
	// MinKeep is the shortest window accepted for dedupe records (claims, finished inbox rows).
	// Anything shorter is almost certainly a unit mistake (a time.Duration counts nanoseconds)
	// and would forget keys before a broker even redelivers.
	MinKeep = time.Minute
	// MaxBatchSize bounds the rows deleted per transaction.
	MaxBatchSize = 100000
)

// Policy is the retention of one consumer's dedupe records.
type Policy struct {
	// Keep is the retention window: a claim (or finished inbox row) is deleted once it is
	// older than this. Zero in Config.Consumers means Config.Default.Keep; zero in
	// Config.Default means DefaultKeep (7 days).
	Keep time.Duration
	// RedeliveryHorizon is the longest a copy of a message can arrive after the original was
	// processed, as the operator declares it: broker retention for an offset reset, the age of
	// the oldest message a dead-letter redrive may send, a replay tool's reach. Zero means
	// undeclared. NewJanitor warns when Keep is shorter: a copy arriving after its key was
	// deleted would be applied again (or, with the middleware's age guard, refused).
	RedeliveryHorizon time.Duration
}

// Config configures a Janitor.
type Config struct {
	// Schema holds watermill-once's tables. Default pgtx.DefaultSchema.
	Schema string

	// Default is the policy of every consumer not listed in Consumers.
	Default Policy
	// Consumers gives listed consumers a policy of their own. A consumer's policy covers all
	// its dedupe records: its claims (processed_messages) and, if it is an inbox consumer, its
	// finished inbox rows.
	Consumers map[string]Policy

	// InboxKeep is how long finished (DONE or SKIPPED) inbox rows of consumers not listed in
	// Consumers are kept; listed consumers keep theirs for their Policy.Keep. A finished row
	// is the dedupe record of its message, like a claim. PENDING, IN_PROGRESS and FAILED rows
	// are never deleted. Default DefaultInboxKeep (7 days).
	InboxKeep time.Duration
	// OutboxKeep is how long outbox rows are kept once every relay has forwarded them. Rows
	// that some relay has not forwarded yet are never deleted, whatever their age. Default
	// DefaultOutboxKeep (24h).
	OutboxKeep time.Duration
	// CDCSlots names replication slots of Debezium connectors reading the outbox
	// (cdc.Config.SlotName) whose positions must be registered. Each round first advances
	// every slot position registered in the outbox (cdc.Prepare, wmonce connector apply,
	// register them) to what its slot has confirmed (cdc.AdvancePosition), so that
	// outbox rows Debezium delivered can go: listed or not, since a position nobody advances
	// holds every later row back. A listed slot without a registered position fails its step
	// (outboxops.ErrSlotPositionNotRegistered), and so does a registered one whose slot is gone
	// (outboxops.ErrSlotMissing). Default none.
	CDCSlots []string
	// HTTPKeysKeep, when set, deletes stored responses of httpidem older than this. Keep it at
	// least as long as the httpidem Retention (rows older than that are ignored there anyway).
	// Zero leaves the table alone (httpidem.Middleware.Prune does the same job; both
	// call httpidem.Prune).
	HTTPKeysKeep time.Duration
	// OutboxRejectedKeep, when set, deletes rows of outbox_rejected (messages the relay could
	// not decode, set aside for an operator) older than this. Zero keeps them until an
	// operator deletes them: a rejected row is the only copy of its message.
	OutboxRejectedKeep time.Duration
	// SentIntentsKeep, when set, deletes SENT intents the provider confirmed longer ago than
	// this (intent.PruneSent). Keep it at least as long as the Keep of the consumers that
	// record intents: a redelivered message is then refused by its claim before its handler
	// could record the deleted intent again. Zero keeps them.
	SentIntentsKeep time.Duration

	// BatchSize is the most rows one delete transaction removes. Short transactions keep
	// locks, WAL bursts and replication lag small. Default DefaultBatchSize (5000), at most
	// MaxBatchSize (100000).
	BatchSize int
	// PollInterval is the time between rounds of Run, and how often a standby instance tries to
	// take over. Default 1 minute.
	PollInterval time.Duration
	// PartitionsAhead is how many days of processed_messages_daily partitions the janitor
	// creates ahead of today, so that claims never wait for a partition to be created. It
	// applies only once that table is in use (has at least one partition). Default
	// 3; negative: create none (expired partitions are still dropped).
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

// Validate reports what to fix in a configuration. Zero values that have defaults are
// accepted; NewJanitor fills them in before validating.
func (c Config) Validate() error {
	errs := []error{
		pgtx.ValidateIdentifier("schema", cmp.Or(c.Schema, pgtx.DefaultSchema)),
	}
	checkKeep := func(what string, d time.Duration, zeroOK bool) {
		if d == 0 && zeroOK {
			return
		}
		if d < MinKeep {
			errs = append(errs, fmt.Errorf("%s is %s: it must be at least %s (a shorter window forgets keys before a broker can redeliver; time.Duration counts nanoseconds)", what, d, MinKeep))
		}
	}
	checkHorizon := func(what string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative (0 = undeclared), got %s", what, d))
		}
	}
	checkKeep("Default.Keep", c.Default.Keep, true)
	checkHorizon("Default.RedeliveryHorizon", c.Default.RedeliveryHorizon)
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		p := c.Consumers[name]
		if err := validateConsumer(name); err != nil {
			errs = append(errs, fmt.Errorf("Consumers[%q]: %w", name, err))
		}
		checkKeep(fmt.Sprintf("Consumers[%q].Keep", name), p.Keep, true)
		checkHorizon(fmt.Sprintf("Consumers[%q].RedeliveryHorizon", name), p.RedeliveryHorizon)
	}
	checkKeep("InboxKeep", c.InboxKeep, true)
	if c.OutboxKeep < 0 {
		errs = append(errs, fmt.Errorf("OutboxKeep must not be negative, got %s", c.OutboxKeep))
	}
	for _, k := range []struct {
		name string
		keep time.Duration
	}{{"HTTPKeysKeep", c.HTTPKeysKeep}, {"OutboxRejectedKeep", c.OutboxRejectedKeep}, {"SentIntentsKeep", c.SentIntentsKeep}} {
		if k.keep != 0 && k.keep < time.Second {
			errs = append(errs, fmt.Errorf("%s must be 0 (off) or at least 1s, got %s", k.name, k.keep))
		}
	}
	for i, slot := range c.CDCSlots {
		if err := pgtx.ValidateIdentifier("slot", slot); err != nil {
			errs = append(errs, fmt.Errorf("CDCSlots[%d]: %w", i, err))
		}
	}
	if c.BatchSize < 0 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("BatchSize must be between 1 and %d (0 = %d), got %d", MaxBatchSize, DefaultBatchSize, c.BatchSize))
	}
	if c.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("PollInterval must not be negative (0 = %s), got %s", defaultPollInterval, c.PollInterval))
	}
	if c.PartitionsAhead > 366 {
		errs = append(errs, fmt.Errorf("PartitionsAhead must be at most 366 days, got %d", c.PartitionsAhead))
	}
	return errors.Join(errs...)
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
