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

// Unbounded is the horizon of a source that keeps messages forever.
const Unbounded time.Duration = -1

// Config says what to check: the consumers, their sources, and the keys' retention.
type Config struct {
	Consumers []Consumer // the consumers to check; required
	// Retention is the janitor's configuration (ops/retention), which says how long each
	// consumer's keys and the outbox rows are kept.
	Retention retention.Config

	Kafka   KafkaConfig   // needed for KafkaTopics
	AMQP    AMQPConfig    // needed for AMQPQueues
	Timeout time.Duration // bounds the whole check; default 30s
}

const defaultTimeout = 30 * time.Second

// Consumer is one consumer and the sources it reads.
type Consumer struct {
	Name          string        // once.Config.Consumer (or the handler name), or the inbox consumer
	MaxMessageAge time.Duration // its age guard (once.Config's, inbox.ReceiverConfig's); 0: none
	Inbox         bool          // its keys are inbox rows, not claims
	KafkaTopics   []string      // the topics it consumes
	AMQPQueues    []string      // the queues it consumes (their dead-letter queues are followed)
	// FromOutbox says this schema's relay forwards its messages (a reset relay sends again
	// every outbox row kept).
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
		errs = append(errs, c.checkConsumer(i, con))
	}
	if err := c.Retention.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Retention: %w", err))
	}
	return errors.Join(errs...)
}

// checkConsumer reports what is wrong with Consumers[i]: each check is a condition and the
// error it gives.
func (c Config) checkConsumer(i int, con Consumer) error {
	checks := []struct {
		broken bool
		err    error
	}{
		{con.Name == "", fmt.Errorf("Consumers[%d]: Name is required", i)},
		{len(con.KafkaTopics) > 0 && len(c.Kafka.Brokers) == 0, fmt.Errorf("consumer %q reads Kafka topics: set Kafka.Brokers", con.Name)},
		{len(con.AMQPQueues) > 0 && c.AMQP.URL == "", fmt.Errorf("consumer %q reads RabbitMQ queues: set AMQP.URL", con.Name)},
		{con.MaxMessageAge < 0, fmt.Errorf("consumer %q: MaxMessageAge must not be negative", con.Name)},
	}
	var errs []error
	for _, ch := range checks {
		if ch.broken {
			errs = append(errs, ch.err)
		}
	}
	return errors.Join(errs...)
}

// Finding is the verdict for one consumer and one source of copies.
type Finding struct {
	Consumer string
	Source   string // "kafka topic payments", "rabbitmq queue q", "outbox relay"
	// Horizon is how old a copy can be when it arrives (Unbounded: any age), if Known.
	Horizon time.Duration
	Known   bool
	KeyKept time.Duration // how long the consumer's keys are kept
	Guard   time.Duration // its MaxMessageAge (0: none)
	Hazard  bool          // a copy can arrive after its key is gone and be applied again
	Verdict string        // what can happen
	Fix     string        // what to set
	Details []string      // what was read
}

func (f Finding) String() string {
	s := fmt.Sprintf("%s: consumer %s, %s: %s", f.state(), f.Consumer, f.Source, f.Verdict)
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
// state is the finding's first word: HAZARD, unknown (not read, no hazard ruled out) or ok.
func (f Finding) state() string {
	switch {
	case f.Hazard:
		return "HAZARD"
	case !f.Known:
		return "unknown"
	}
	return "ok"
}

func (r Report) Hazards() []Finding { return r.filter(func(f Finding) bool { return f.Hazard }) }

// filter returns the findings for which keep holds.
func (r Report) filter(keep func(Finding) bool) []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if keep(f) {
			out = append(out, f)
		}
	}
	return out
}

// Unknown returns the findings whose source could not be read: no hazard ruled out there.
func (r Report) Unknown() []Finding {
	return r.filter(func(f Finding) bool { return f.state() == "unknown" })
}

// Summary is one line: the sources checked, the hazards, the sources not read.
func (r Report) Summary() string {
	hz := r.Hazards()
	if len(hz) == 0 {
		unknown := r.Unknown()
		if len(unknown) == 0 {
			return fmt.Sprintf("doctor: %d consumer source(s) checked, no redelivery hazard (0 unknown)", len(r.Findings))
		}
		return fmt.Sprintf("doctor: NOT CHECKED %d of %d consumer source(s): %s: could not be read, so a redelivery hazard there is not ruled out (none in the others)",
			len(unknown), len(r.Findings), sources(unknown))
	}
	return fmt.Sprintf("doctor: REDELIVERY HAZARD on %d of %d consumer source(s): %s: a copy can arrive after its key was pruned and be applied again",
		len(hz), len(r.Findings), sources(hz))
}

// sources names the consumer and source of each finding.
func sources(fs []Finding) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.Consumer + " <- " + f.Source
	}
	return strings.Join(names, "; ")
}

// Check compares, per consumer and source, what can be redelivered with the keys' retention and
// age guard. A source it cannot read is a finding with Known false.
func Check(ctx context.Context, config Config) (Report, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return Report{}, fmt.Errorf("doctor: invalid config: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, config.Timeout)
	defer cancel()
	c := &checker{config: config}
	defer c.close()
	var rep Report
	for _, con := range config.Consumers {
		rep.Findings = append(rep.Findings, c.consumer(ctx, con)...)
	}
	return rep, nil
}

// checker reads the sources of Check's consumers; the Kafka connection is opened on first use
// and shared.
type checker struct {
	config Config
	kr     *kafkaReader
}

// consumer judges every source of con.
func (c *checker) consumer(ctx context.Context, con Consumer) []Finding {
	kept := keyKept(c.config.Retention, con)
	var out []Finding
	for _, topic := range con.KafkaTopics {
		h := c.kafka().topicHorizon(ctx, topic)
		out = append(out, judge(con, kept, "kafka topic "+topic, h, "retention.ms of topic "+topic))
	}
	for _, q := range con.AMQPQueues {
		for _, h := range queueHorizons(ctx, c.config.AMQP, q) {
			out = append(out, judge(con, kept, h.source, h, "the message TTL (x-message-ttl or a policy's message-ttl) of "+h.source))
		}
	}
	if con.FromOutbox {
		out = append(out, judge(con, kept, "outbox relay (replay)", outboxHorizon(c.config.Retention), "retention OutboxKeep"))
	}
	return out
}

func (c *checker) kafka() *kafkaReader {
	if c.kr == nil {
		c.kr = newKafkaReader(c.config.Kafka)
	}
	return c.kr
}

func (c *checker) close() {
	if c.kr != nil {
		c.kr.close()
	}
}

// outboxHorizon is what a relay whose offset is reset forwards again: every outbox row kept.
func outboxHorizon(r retention.Config) horizon {
	keep := cmp.Or(r.OutboxKeep, retention.DefaultOutboxKeep)
	return horizon{horizon: keep, known: true, details: []string{
		fmt.Sprintf("outbox rows are kept %s after every relay forwarded them (retention OutboxKeep); a relay whose offset is reset forwards them again", keep)}}
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
	keyName := retentionSetting(con)
	switch {
	case guard > kept:
		f.Hazard = true
		f.Verdict = fmt.Sprintf("the age guard (MaxMessageAge %s) is longer than the keys are kept (%s): a copy between the two ages finds no key and passes the guard: it is applied again", guard, kept)
		f.Fix = fmt.Sprintf("MaxMessageAge a little below %s, or %s of at least %s", kept, keyName, guard)
	case !h.known:
		f.Verdict, f.Fix = unknownVerdict(guarded, guard, kept)
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

// unknownVerdict is the verdict and fix of a source that could not be read: safe only when the
// age guard covers the keys' retention.
func unknownVerdict(guarded bool, guard, kept time.Duration) (verdict, fix string) {
	verdict = "cannot tell how old a copy can be (the source could not be read, see below)"
	if guarded {
		return verdict + fmt.Sprintf("; the age guard (%s, within the %s keys are kept) refuses older copies, so none is applied twice", guard, kept), ""
	}
	return verdict + fmt.Sprintf("; keys are kept %s and no age guard is set", kept),
		fmt.Sprintf("MaxMessageAge a little below %s (once.Config, inbox.ReceiverConfig), so a copy older than its key is refused, not applied", kept)
}

// retentionSetting names the setting that keeps con's keys.
func retentionSetting(con Consumer) string {
	if con.Inbox {
		return "inbox retention (retention.Config InboxKeep or the consumer's Keep)"
	}
	return "claim retention (retention.Config Keep)"
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
