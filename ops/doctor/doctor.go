package doctor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/ops/retention"
)

// Unbounded is the horizon of a source that keeps messages forever (Kafka retention.ms=-1, a
// compacted topic, a queue without a message TTL).
const Unbounded time.Duration = -1

// Config says what to check: the consumers, where their messages come from, and how long the
// library keeps their keys.
type Config struct {
	// Consumers to check. Required.
	Consumers []Consumer
	// Retention is the janitor's configuration (ops/retention): each consumer's claims are kept
	// for its Policy.Keep (Default.Keep, retention.DefaultKeep when unset), inbox consumers'
	// finished rows for their Keep or InboxKeep, outbox rows for OutboxKeep. Use the one the
	// janitor runs with.
	Retention retention.Config

	// Kafka reads topic and broker configuration (Sarama ClusterAdmin). Needed when a consumer
	// has KafkaTopics.
	Kafka KafkaConfig
	// AMQP reads queue TTLs. Needed when a consumer has AMQPQueues.
	AMQP AMQPConfig

	// Timeout bounds the whole check. Default 30 seconds.
	Timeout time.Duration
}

const defaultTimeout = 30 * time.Second

// Consumer is one consumer and the sources it reads.
type Consumer struct {
	// Name is the consumer (once.Config.Consumer or the handler name; the inbox consumer).
	Name string
	// MaxMessageAge is its age guard (once.Config.MaxMessageAge, inbox.ReceiverConfig's): copies
	// whose event is older are refused and parked rather than applied. Zero: no guard.
	MaxMessageAge time.Duration
	// Inbox says the consumer's keys are inbox rows (inbox.Receiver), kept for its Policy.Keep
	// or Retention.InboxKeep, not claims.
	Inbox bool
	// KafkaTopics it consumes.
	KafkaTopics []string
	// AMQPQueues it consumes. Their dead-letter queues are followed when the management API
	// tells them.
	AMQPQueues []string
	// FromOutbox says its messages are forwarded by this schema's relay: a relay whose offset
	// is reset forwards again every outbox row still kept (Retention.OutboxKeep).
	FromOutbox bool
}

func (c *Config) setDefaults() {
	c.Timeout = cmp.Or(c.Timeout, defaultTimeout)
	c.AMQP.setDefaults()
}

// Validate reports what to fix in a configuration.
func (c Config) Validate() error {
	var errs []error
	if len(c.Consumers) == 0 {
		errs = append(errs, errors.New("no consumer to check: list each consumer with the topics and queues it reads"))
	}
	for i, con := range c.Consumers {
		if con.Name == "" {
			errs = append(errs, fmt.Errorf("Consumers[%d]: Name is required", i))
		}
		if len(con.KafkaTopics) > 0 && len(c.Kafka.Brokers) == 0 {
			errs = append(errs, fmt.Errorf("consumer %q reads Kafka topics: set Kafka.Brokers", con.Name))
		}
		if len(con.AMQPQueues) > 0 && c.AMQP.URL == "" {
			errs = append(errs, fmt.Errorf("consumer %q reads RabbitMQ queues: set AMQP.URL", con.Name))
		}
		if con.MaxMessageAge < 0 {
			errs = append(errs, fmt.Errorf("consumer %q: MaxMessageAge must not be negative", con.Name))
		}
	}
	if err := c.Retention.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Retention: %w", err))
	}
	return errors.Join(errs...)
}

// Finding is the verdict for one consumer and one source of copies.
type Finding struct {
	Consumer string
	// Source is where copies come from: "kafka topic payments", "rabbitmq queue q", "outbox relay".
	Source string
	// Horizon is how old a copy can be when it arrives (Unbounded: any age); meaningful when
	// Known.
	Horizon time.Duration
	Known   bool
	// KeyKept is how long the consumer's keys are kept; Guard its MaxMessageAge (0: none).
	KeyKept, Guard time.Duration
	// Hazard: a copy can arrive after its key is gone and be applied again.
	Hazard bool
	// Verdict says what can happen, Fix what to set; Details what was read.
	Verdict string
	Fix     string
	Details []string
}

func (f Finding) String() string {
	state := "ok"
	switch {
	case f.Hazard:
		state = "HAZARD"
	case !f.Known:
		state = "unknown"
	}
	s := fmt.Sprintf("%s: consumer %s, %s: %s", state, f.Consumer, f.Source, f.Verdict)
	if f.Fix != "" {
		s += "\n    set: " + f.Fix
	}
	for _, d := range f.Details {
		s += "\n    read: " + d
	}
	return s
}

// Report is every finding of a check.
type Report struct{ Findings []Finding }

// Hazards returns the findings that are hazards.
func (r Report) Hazards() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Hazard {
			out = append(out, f)
		}
	}
	return out
}

// Unknown returns the findings whose source could not be read (Known false, no hazard): a
// hazard there is not ruled out.
func (r Report) Unknown() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if !f.Known && !f.Hazard {
			out = append(out, f)
		}
	}
	return out
}

// Summary is one line: how many sources were checked and which are hazards, or which could
// not be checked.
func (r Report) Summary() string {
	hz := r.Hazards()
	if len(hz) == 0 {
		unknown := r.Unknown()
		if len(unknown) == 0 {
			return fmt.Sprintf("doctor: %d consumer source(s) checked, no redelivery hazard (0 unknown)", len(r.Findings))
		}
		names := make([]string, len(unknown))
		for i, f := range unknown {
			names[i] = f.Consumer + " <- " + f.Source
		}
		return fmt.Sprintf("doctor: NOT CHECKED %d of %d consumer source(s): %s: could not be read, so a redelivery hazard there is not ruled out (none in the others)",
			len(unknown), len(r.Findings), strings.Join(names, "; "))
	}
	names := make([]string, len(hz))
	for i, f := range hz {
		names[i] = f.Consumer + " <- " + f.Source
	}
	return fmt.Sprintf("doctor: REDELIVERY HAZARD on %d of %d consumer source(s): %s: a copy can arrive after its key was pruned and be applied again",
		len(hz), len(r.Findings), strings.Join(names, "; "))
}

// Check reads what the brokers and the outbox will redeliver and compares it, per consumer
// and source, with how long the consumer's keys are kept and its age guard. It returns an
// error for a configuration it cannot use; a broker it cannot read is a finding whose Known is
// false, not an error.
func Check(ctx context.Context, config Config) (Report, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return Report{}, fmt.Errorf("doctor: invalid config: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, config.Timeout)
	defer cancel()
	var rep Report
	var kafka *kafkaReader
	for _, con := range config.Consumers {
		kept := keyKept(config.Retention, con)
		for _, topic := range con.KafkaTopics {
			if kafka == nil {
				kafka = newKafkaReader(config.Kafka)
				defer kafka.close()
			}
			h := kafka.topicHorizon(ctx, topic)
			rep.Findings = append(rep.Findings, judge(con, kept, "kafka topic "+topic, h, "retention.ms of topic "+topic))
		}
		for _, q := range con.AMQPQueues {
			for _, h := range queueHorizons(ctx, config.AMQP, q) {
				rep.Findings = append(rep.Findings, judge(con, kept, h.source, h, "the message TTL (x-message-ttl or a policy's message-ttl) of "+h.source))
			}
		}
		if con.FromOutbox {
			keep := cmp.Or(config.Retention.OutboxKeep, retention.DefaultOutboxKeep)
			h := horizon{horizon: keep, known: true, details: []string{
				fmt.Sprintf("outbox rows are kept %s after every relay forwarded them (retention OutboxKeep); a relay whose offset is reset forwards them again", keep)}}
			rep.Findings = append(rep.Findings, judge(con, kept, "outbox relay (replay)", h, "retention OutboxKeep"))
		}
	}
	return rep, nil
}

// keyKept is how long con's keys are kept under the janitor's configuration r.
func keyKept(r retention.Config, con Consumer) time.Duration {
	if p, ok := r.Consumers[con.Name]; ok && p.Keep > 0 {
		return p.Keep
	}
	if con.Inbox {
		return cmp.Or(r.InboxKeep, retention.DefaultInboxKeep)
	}
	return cmp.Or(r.Default.Keep, retention.DefaultKeep)
}

// horizon is what a source can redeliver.
type horizon struct {
	source  string
	horizon time.Duration
	known   bool
	details []string
	setting string // the broker setting that bounds it, when not the caller's default
}

// judge compares a source's horizon with the consumer's key retention and age guard.
func judge(con Consumer, kept time.Duration, source string, h horizon, brokerSetting string) Finding {
	brokerSetting = cmp.Or(h.setting, brokerSetting)
	f := Finding{Consumer: con.Name, Source: source, Horizon: h.horizon, Known: h.known, KeyKept: kept, Guard: con.MaxMessageAge, Details: h.details}
	guard := con.MaxMessageAge
	guarded := guard > 0 && guard <= kept
	keyName := "claim retention (retention.Config Keep)"
	if con.Inbox {
		keyName = "inbox retention (retention.Config InboxKeep or the consumer's Keep)"
	}
	switch {
	case guard > kept:
		f.Hazard = true
		f.Verdict = fmt.Sprintf("the age guard (MaxMessageAge %s) is longer than the keys are kept (%s): a copy between the two ages finds no key and passes the guard: it is applied again", guard, kept)
		f.Fix = fmt.Sprintf("MaxMessageAge a little below %s, or %s of at least %s", kept, keyName, guard)
	case !h.known:
		f.Verdict = "cannot tell how old a copy can be (the source could not be read, see below)"
		if guarded {
			f.Verdict += fmt.Sprintf("; the age guard (%s, within the %s keys are kept) refuses older copies, so none is applied twice", guard, kept)
		} else {
			f.Verdict += fmt.Sprintf("; keys are kept %s and no age guard is set", kept)
			f.Fix = fmt.Sprintf("MaxMessageAge a little below %s (once.Config, inbox.ReceiverConfig), so a copy older than its key is refused, not applied", kept)
		}
	case h.horizon != Unbounded && h.horizon <= kept:
		f.Verdict = fmt.Sprintf("a copy arrives at most %s after its event; keys are kept %s: a late copy is always found a duplicate", h.horizon, kept)
	case guarded:
		f.Verdict = fmt.Sprintf("a copy can arrive %s after its event, after its key is gone (kept %s); the age guard (%s) refuses and parks such a copy, so none is applied twice (parked copies need a person)",
			horizonText(h.horizon), kept, guard)
		f.Fix = fmt.Sprintf("to drop late copies as duplicates instead of parking them: %s", keepFix(keyName, brokerSetting, h.horizon, kept))
	default:
		f.Hazard = true
		f.Verdict = fmt.Sprintf("a copy can arrive %s after its event, but its key is kept %s and no age guard covers the gap: such a copy is applied again", horizonText(h.horizon), kept)
		f.Fix = keepFix(keyName, brokerSetting, h.horizon, kept) + fmt.Sprintf("; or MaxMessageAge a little below %s, so late copies are refused and parked", kept)
	}
	return f
}

func horizonText(h time.Duration) string {
	if h == Unbounded {
		return "any time (the source keeps messages forever)"
	}
	return "up to " + h.String()
}

func keepFix(keyName, brokerSetting string, h, kept time.Duration) string {
	if h == Unbounded {
		return fmt.Sprintf("%s, so that the source keeps messages at most %s (today it keeps them forever)", brokerSetting, kept)
	}
	return fmt.Sprintf("%s of at least %s, or %s of at most %s", keyName, h, brokerSetting, kept)
}
