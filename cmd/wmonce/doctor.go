package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/wmonce/watermill-once/internal/operate"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/sqlrebase"
	"github.com/wmonce/watermill-once/ops/doctor"
	"github.com/wmonce/watermill-once/ops/retention"
)

func doctorCommand() *command {
	return &command{
		name:    "doctor",
		summary: "check that no broker can redeliver a copy after its dedupe key is pruned, and that the outbox positions are of this cluster",
		usage: `
doctor [-consumer C [-kafka TOPIC,...] [-amqp QUEUE,...] [-max-message-age AGE] [-inbox] [-from-outbox]
       [-consumer C2 ...]] [-keep AGE] [-inbox-keep AGE] [-outbox-keep AGE]
       [-kafka-brokers HOST:PORT,...] [-amqp-url URL] [-management-url URL] [-broker-schema NAME]`,
		details: `
Reads what the brokers will redeliver and compares it, per consumer and source, with how long
the consumer's keys are kept (-keep, -inbox-keep, the janitor's windows) and its age guard
(-max-message-age, once.Config.MaxMessageAge): Kafka topics' retention.ms and cleanup.policy
and the broker's offsets.retention.minutes (an offset reset replays the topic); RabbitMQ
queues' message TTLs and their dead-letter queues through the management API, or, when it is
off, the queue's own arguments over AMQP; with -from-outbox the outbox rows a reset relay
forwards again (-outbox-keep). It says whether a copy can arrive after its key is gone and
what to set.

-consumer starts a consumer; the flags after it, up to the next -consumer, describe it.
Without -consumer it checks only the outbox positions.

It also checks that the outbox relay positions of -schema were recorded on this cluster:
after a restore or a move into a cluster with a lower transaction
counter they would skip rows for good, and a RESTORED line says to run wmonce rebase.
-broker-schema (default $BROKER_SQL_SCHEMA) checks the SQL broker's topic tables in that
schema the same way.

Exit status, for CI: 0 every source was read and none is a hazard; 1 a hazard or a restored
position was found (whatever else could not be read); 3 no hazard was found, but a source could
not be read (an "unknown" line: a broker unreachable, a topic or queue missing, no permission, the
outbox positions unreadable when they are all doctor checks), so a hazard there is not ruled
out; 2 a usage error.`,
		examples: []string{
			"wmonce doctor -consumer payments -kafka payments,refunds -keep 7d",
			"wmonce doctor -consumer sms -amqp sms,sms.dlq -max-message-age 6d -consumer rewards -kafka rewards",
			"KAFKA_BROKERS=127.0.0.1:9092 wmonce doctor -json -consumer payments -kafka payments",
		},
		actions: []action{{new: newDoctor}},
	}
}

// consumerFlags are the flags that describe the consumer named by the -consumer before them.
var consumerFlags = []struct {
	name, usage string
	isBool      bool
	set         func(c *doctor.Consumer, value string) error
}{
	{"kafka", "Kafka topics the consumer reads, comma-separated", false, func(c *doctor.Consumer, s string) error {
		c.KafkaTopics = append(c.KafkaTopics, splitList(s)...)
		return nil
	}},
	{"amqp", "RabbitMQ queues the consumer reads, comma-separated", false, func(c *doctor.Consumer, s string) error {
		c.AMQPQueues = append(c.AMQPQueues, splitList(s)...)
		return nil
	}},
	{"max-message-age", "the consumer's age guard, once.Config.MaxMessageAge (e.g. 144h or 6d)", false, func(c *doctor.Consumer, s string) error {
		d, err := parseAge(s)
		c.MaxMessageAge = d
		return err
	}},
	{"inbox", "the consumer is an inbox consumer: its keys are inbox rows", true, func(c *doctor.Consumer, _ string) error {
		c.Inbox = true
		return nil
	}},
	{"from-outbox", "the consumer's messages come through this schema's outbox relay", true, func(c *doctor.Consumer, _ string) error {
		c.FromOutbox = true
		return nil
	}},
}

// splitList reads a comma-separated list, blanks left out.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// doctorFlags registers doctor's flags on fs: the consumers into cfg, each described by the
// consumer flags after its -consumer; parseErr says a consumer flag came before any -consumer.
func doctorFlags(fs *flag.FlagSet, cfg *doctor.Config, parseErr *error) {
	var cur *doctor.Consumer
	fs.Func("consumer", "a consumer to check (repeatable; the flags after it describe it)", func(s string) error {
		cfg.Consumers = append(cfg.Consumers, doctor.Consumer{Name: s})
		cur = &cfg.Consumers[len(cfg.Consumers)-1]
		return nil
	})
	for _, f := range consumerFlags {
		set := func(s string) error {
			c := cur
			if c == nil {
				if *parseErr == nil {
					*parseErr = usagef("-%s describes a consumer: give -consumer NAME before it", f.name)
				}
				c = &doctor.Consumer{} // the value is still checked
			}
			return f.set(c, s)
		}
		if f.isBool {
			fs.BoolFunc(f.name, f.usage, set)
		} else {
			fs.Func(f.name, f.usage, set)
		}
	}
}

// doctorRun is `wmonce doctor`: the consumers and sources to check, and the retention to
// check them against.
type doctorRun struct {
	cfg                         doctor.Config
	parseErr                    error
	keep, inboxKeep, outboxKeep string
	brokers, amqpURL, mgmtURL   string
	brokerSchema                *string
}

func newDoctor(fs *flag.FlagSet) runner {
	d := &doctorRun{}
	doctorFlags(fs, &d.cfg, &d.parseErr)
	fs.StringVar(&d.keep, "keep", "", "how long claims are kept: the janitor's Keep (default 7d)")
	fs.StringVar(&d.inboxKeep, "inbox-keep", "", "how long finished inbox rows are kept (default 7d)")
	fs.StringVar(&d.outboxKeep, "outbox-keep", "", "how long relayed outbox rows are kept (default 24h)")
	fs.StringVar(&d.brokers, "kafka-brokers", os.Getenv(broker.EnvKafkaBrokers), "Kafka bootstrap addresses (default $"+broker.EnvKafkaBrokers+")")
	fs.StringVar(&d.amqpURL, "amqp-url", os.Getenv(broker.EnvAMQPURL), "RabbitMQ URL of the consumers' vhost (default $"+broker.EnvAMQPURL+", else "+broker.DefaultAMQPURL+")")
	fs.StringVar(&d.mgmtURL, "management-url", "", "RabbitMQ management API (default http://HOST:15672 with the AMQP URL's credentials)")
	d.brokerSchema = brokerSchemaFlag(fs)
	return d
}

func (d *doctorRun) check([]string) error {
	r := &d.cfg.Retention
	var errs [3]error
	r.Default.Keep, errs[0] = optionalAge("-keep", d.keep)
	r.InboxKeep, errs[1] = optionalAge("-inbox-keep", d.inboxKeep)
	r.OutboxKeep, errs[2] = optionalAge("-outbox-keep", d.outboxKeep)
	d.cfg.Kafka.Brokers = splitList(d.brokers)
	d.cfg.AMQP.URL = cmp.Or(d.amqpURL, broker.DefaultAMQPURL)
	d.cfg.AMQP.ManagementURL = d.mgmtURL
	return operate.FirstError(d.parseErr, errs[0], errs[1], errs[2], d.checkKafka())
}

// checkKafka refuses Kafka topics without brokers to read them from.
func (d *doctorRun) checkKafka() error {
	for _, c := range d.cfg.Consumers {
		if len(c.KafkaTopics) > 0 && d.cfg.Kafka.Brokers == nil {
			return usagef("consumer %s reads Kafka topics: give -kafka-brokers or set %s", c.Name, broker.EnvKafkaBrokers)
		}
	}
	return nil
}

func (d *doctorRun) run(ctx context.Context, e *env) error {
	res := doctorResult{consumers: len(d.cfg.Consumers) > 0, brokerSchema: *d.brokerSchema}
	res.positions, res.posErr = e.checkPositions(ctx)
	res.tables, res.tablesErr = e.checkBrokerTables(ctx, *d.brokerSchema)
	if isUsage(res.tablesErr) {
		return res.tablesErr
	}
	var err error
	if res.consumers {
		if res.rep, err = doctor.Check(ctx, d.cfg); err != nil {
			return err
		}
	}
	if err := e.printDoctor(res); err != nil {
		return err
	}
	return res.verdict()
}

// doctorResult is what doctor found: the consumers' sources, the outbox positions and the SQL
// broker's topic tables (nil without -broker-schema).
type doctorResult struct {
	consumers    bool
	brokerSchema string
	rep          doctor.Report
	positions    outboxops.PositionReport
	posErr       error
	tables       *sqlrebase.MoveReport
	tablesErr    error
}

func (e *env) printDoctor(r doctorResult) error {
	if e.g.json {
		out := map[string]any{"findings": r.rep.Findings, "hazards": len(r.rep.Hazards()), "unknown": len(r.rep.Unknown()), "summary": r.rep.Summary(), "positions": r.positions}
		if r.posErr != nil {
			out["positions_error"] = r.posErr.Error()
		}
		if r.tables != nil {
			out["broker"] = r.tables
		}
		if r.tablesErr != nil {
			out["broker_error"] = r.tablesErr.Error()
		}
		return e.printJSON(out)
	}
	e.printPositions(r.positions, r.posErr)
	e.printBrokerTables(r.tables, "")
	if r.tablesErr != nil {
		fmt.Fprintf(e.stdout, "unknown: SQL broker topic tables of schema %s: %v\n", r.brokerSchema, r.tablesErr)
	}
	for _, f := range r.rep.Findings {
		fmt.Fprintln(e.stdout, f)
	}
	if r.consumers {
		fmt.Fprintln(e.stdout, r.rep.Summary())
	}
	return nil
}

// verdict is doctor's exit: 1 for a moved position or table or a hazard, 3 when a source could
// not be checked, else 0. Unreadable outbox positions count only when they are all doctor
// checks: beside consumers they are a line of their own, so a broker-only gate needs no database.
func (r doctorResult) verdict() error {
	var errs []error
	if err := r.positions.Err(); err != nil {
		errs = append(errs, fmt.Errorf("the outbox positions were recorded on another cluster: run what the RESTORED lines say"))
	}
	if r.tables != nil && r.tables.Err() != nil {
		errs = append(errs, errors.New("the SQL broker's topic tables hold transaction ids of another cluster: run what the RESTORED lines say"))
	}
	if len(r.rep.Hazards()) > 0 {
		errs = append(errs, errors.New("a copy can arrive after its key was pruned: set what the HAZARD lines say"))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	unknown := len(r.rep.Unknown())
	if r.posErr != nil && !r.consumers {
		unknown++
	}
	if r.tablesErr != nil {
		unknown++
	}
	if unknown > 0 {
		return &uncheckedError{msg: fmt.Sprintf("%d source(s) could not be checked (the unknown lines say why): make them reachable and run again", unknown)}
	}
	return nil
}

// checkPositions checks the schema's relay positions against this cluster (outboxops.
// CheckPositions); an error means they could not be read (no database, no tables), which
// doctor reports as unknown.
func (e *env) checkPositions(ctx context.Context) (outboxops.PositionReport, error) {
	db, err := e.open(ctx)
	if err != nil {
		return outboxops.PositionReport{Schema: e.g.schema}, err
	}
	return outboxops.CheckPositions(ctx, db, e.g.schema)
}

func (e *env) printPositions(r outboxops.PositionReport, err error) {
	w := e.stdout
	switch {
	case err != nil:
		fmt.Fprintf(w, "unknown: outbox positions of schema %s: %v\n", e.g.schema, err)
	case r.Err() != nil:
		for _, c := range r.Moved() {
			fmt.Fprintf(w, "RESTORED: schema %s, %s\n", r.Schema, c.Finding(r.Schema))
		}
	default:
		fmt.Fprintf(w, "ok: outbox positions of schema %s (%d) were recorded on this cluster\n", r.Schema, len(r.Positions))
	}
}

// optionalAge reads an age flag ("" is unset: the janitor's default).
func optionalAge(flag, s string) (time.Duration, error) {
	var d time.Duration
	if err := ageFlag(flag, s, &d); err != nil {
		return 0, err
	}
	return d, usageIf(s != "" && d < retention.MinKeep, "%s %s is shorter than the janitor accepts (%s)", flag, d, retention.MinKeep)
}
