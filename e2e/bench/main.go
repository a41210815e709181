// Command bench measures watermill-once against its peers in one run, on the same machine,
// payload (256 bytes) and business write (one INSERT per message), with processed_messages
// pre-loaded (1M rows by default):
//
//	go run ./e2e/bench                      # every variant over SQL, Kafka and RabbitMQ
//	go run ./e2e/bench -quick               # a smaller run, a minute or two
//	go run ./e2e/bench -brokers kafka -variants B1,B3,B4 -messages 50000
//	go run ./e2e/bench -profile /tmp/prof   # one CPU profile per variant
//
// Variants (see variantTitles): B0 bare handler; B1 business write in its own transaction;
// B2 B1 + Watermill's in-memory Deduplicator; B3 the effectively-once middleware with a
// transaction per message (GroupCommit.Disabled; over SQL the subscriber's transaction); B4 the
// same with group commit, its default; B5 inbox ingest and inbox processing; B6 Watermill's SQL subscriber with
// the write in its transaction; the outbox relay against Watermill's forwarder; C1 raw claims;
// e2e-50 and e2e-1000 end-to-end latency (producer commit -> relay -> broker -> effectively-once
// commit) at 50 and 1,000 events/s; idle-relay, idle-sql-sub and idle-sql-poll queries per
// second with no traffic. -amqp-compare and -sql-compare add the settings before issue 14.
//
// The pool is sized from the server's max_connections and the connections in use.
//
// Services: DATABASE_URL (default local PostgreSQL), AMQP_URL (default local RabbitMQ), and
// KAFKA_BROKERS; without it Kafka is an embedded kfake broker in this process (say so when
// quoting figures: it shares the process and the CPUs). Everything is written to a dedicated
// schema (-schema, default wmonce_bench) and to topics, queues and tables named after the run,
// removed at the end.
//
// Each variant reports the CPU time of this process and of its PostgreSQL backends per 1,000
// messages (cpu.go). It prints a table and the ratios against the targets, and writes e2e/bench/results/latest.json,
// latest.md, latest.png and latency.png (-out).
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
	"github.com/wmonce/watermill-once/pgtx"
)

type options struct {
	databaseURL    string
	schema         string
	brokers        []broker.Kind
	variants       []string
	messages       int
	processRows    int
	relayRows      int
	inFlight       int
	inboxWorkers   int
	inboxTxBatch   int
	sqlBatch       int
	groupWorkers   int
	batchLinger    time.Duration // B7: GroupCommitConfig.Linger
	e2eNoGroup     bool          // the e2e consumers with GroupCommit.Disabled
	e2eSQLBatch    int           // the e2e SQL subscriptions' BatchSize (0: the broker's default)
	e2ePartitions  int           // the e2e Kafka topics' partitions (0: the broker's default)
	relayBatch     int
	rounds         int
	relayLanes     int
	preload        int
	rebuildPreload bool
	c1Duration     time.Duration
	variantTimeout time.Duration
	outDir         string
	profileDir     string
	verbose        bool
	quick          bool
	render         string
	e2eDuration    time.Duration
	idleWindow     time.Duration
	amqpCompare    bool
	sqlCompare     bool
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if o.render != "" {
		if err := render(o.render, o.outDir); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(runAndWrite(o))
}

// runAndWrite runs the benchmark until it ends or Ctrl-C, writes the results when asked, and
// returns the exit status (1 if the run or a variant failed).
func runAndWrite(o options) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if o.outDir != "" {
		if err := writeResults(o.outDir, rep); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		fmt.Printf("\nwrote %s/latest.{json,md,png}\n", o.outDir)
	}
	if rep.failed() {
		return 1
	}
	return 0
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o options
	var brokers, variants string
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL, else "+pgtx.DefaultDatabaseURL+")")
	fs.StringVar(&o.schema, "schema", "wmonce_bench", "schema the benchmark owns (its tables are truncated); must contain \"bench\"")
	fs.StringVar(&brokers, "brokers", "sql,kafka,amqp", "brokers to run over")
	fs.StringVar(&variants, "variants", "all", "comma-separated variants: "+strings.Join(allVariants, ",")+"; all: every one but "+strings.Join(namedOnlyVariants, ","))
	fs.IntVar(&o.messages, "messages", 20000, "messages per consuming variant and broker")
	fs.IntVar(&o.processRows, "process-rows", 50000, "inbox rows per processing variant")
	fs.IntVar(&o.relayRows, "relay-rows", 20000, "outbox rows for the relay and the forwarder")
	fs.IntVar(&o.inFlight, "inflight", 64, "messages in flight: Kafka partitions, RabbitMQ subscriptions x Workers, SQL topics; also C1 clients")
	fs.IntVar(&o.inboxWorkers, "inbox-workers", 8, "inbox processor workers")
	fs.IntVar(&o.rounds, "rounds", 3, "run everything this many times, one round after the other, and report each variant's median round (the machine is shared: one round alone can be hit by someone else's load)")
	fs.IntVar(&o.relayBatch, "relay-batch", 0, "relay BatchSize (0: the relay's default)")
	fs.IntVar(&o.relayLanes, "relay-lanes", 64, "relay-lanes: PublishLanes")
	fs.IntVar(&o.groupWorkers, "group-workers", 0, "B4 and the e2e consumers: GroupCommitConfig.Workers (0: the middleware's default)")
	fs.DurationVar(&o.batchLinger, "batch-linger", 0, "B7: GroupCommitConfig.Linger (0: a group is what arrived while every lane was busy)")
	fs.BoolVar(&o.e2eNoGroup, "e2e-group-commit-off", false, "e2e variants: the consumer with GroupCommit.Disabled, a transaction per message (the default is group commit)")
	fs.IntVar(&o.e2eSQLBatch, "e2e-sql-batch", 0, "e2e variants over SQL: the subscription's BatchSize (0: the broker's default), to compare defaults in one run")
	fs.IntVar(&o.e2ePartitions, "e2e-partitions", 0, "e2e variants over Kafka: the topic's partitions (0: the broker's default), to compare defaults in one run")
	fs.IntVar(&o.sqlBatch, "sql-batch", 100, "SQL broker: messages per subscriber transaction (watermill-sql's BatchSize); the middleware's savepoint per message is a subtransaction, and PostgreSQL caches at most 64 per transaction")
	fs.IntVar(&o.inboxTxBatch, "inbox-txbatch", 200, "inbox processor TxBatchSize (BatchSize is twice it in lease mode)")
	fs.IntVar(&o.preload, "preload", 1000000, "rows pre-loaded into processed_messages (kept across runs)")
	fs.BoolVar(&o.rebuildPreload, "rebuild-preload", false, "delete and load the pre-loaded rows again")
	fs.DurationVar(&o.c1Duration, "c1-duration", 5*time.Second, "duration of each C1 ceiling run")
	fs.DurationVar(&o.variantTimeout, "timeout", 3*time.Minute, "limit for one variant")
	fs.StringVar(&o.outDir, "out", "e2e/bench/results", "directory for latest.{json,md,png} and latency.png; empty: write nothing")
	fs.StringVar(&o.profileDir, "profile", "", "directory for one CPU profile per variant (go tool pprof)")
	fs.BoolVar(&o.verbose, "v", false, "log everything the components log")
	fs.StringVar(&o.render, "render", "", "measure nothing: read this latest.json and write its markdown and chart again into -out")
	fs.BoolVar(&o.quick, "quick", false, "small run: 3000 messages and rows, 100k preload, 2s C1, 5s e2e and idle windows")
	fs.DurationVar(&o.e2eDuration, "e2e-duration", 10*time.Second, "how long each end-to-end latency variant produces events (e2e-50: 50/s, e2e-1000: 1000/s)")
	fs.DurationVar(&o.idleWindow, "idle-window", 10*time.Second, "how long each idle query-rate variant is counted")
	fs.BoolVar(&o.sqlCompare, "sql-compare", false, "SQL broker: also run every variant with subscribers polling (DisableListen), reported as broker sql-poll")
	fs.BoolVar(&o.amqpCompare, "amqp-compare", false, "RabbitMQ: also run every variant with the settings before issue 14 (Prefetch 1, Workers 1), reported as broker amqp-p1c1")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["messages"] {
			o.messages = 3000
		}
		if !set["process-rows"] {
			o.processRows = 3000
		}
		if !set["relay-rows"] {
			o.relayRows = 3000
		}
		if !set["preload"] {
			o.preload = 100000
		}
		if !set["c1-duration"] {
			o.c1Duration = 2 * time.Second
		}
		if !set["rounds"] {
			o.rounds = 1
		}
		if !set["e2e-duration"] {
			o.e2eDuration = 5 * time.Second
		}
		if !set["idle-window"] {
			o.idleWindow = 5 * time.Second
		}
	}
	if o.databaseURL == "" {
		o.databaseURL = os.Getenv(broker.EnvDatabaseURL)
	}
	if o.databaseURL == "" {
		o.databaseURL = pgtx.DefaultDatabaseURL
	}
	for _, b := range strings.Split(brokers, ",") {
		k := broker.Kind(strings.TrimSpace(strings.ToLower(b)))
		if k == "" {
			continue
		}
		if !slices.Contains(broker.Kinds, k) {
			return o, fmt.Errorf("-brokers: unknown broker %q (use sql, kafka, amqp)", b)
		}
		o.brokers = append(o.brokers, k)
	}
	if variants == "all" {
		o.variants = slices.DeleteFunc(slices.Clone(allVariants), func(v string) bool { return slices.Contains(namedOnlyVariants, v) })
	} else {
		for _, v := range strings.Split(variants, ",") {
			v = strings.TrimSpace(v)
			i := slices.IndexFunc(allVariants, func(a string) bool { return strings.EqualFold(a, v) })
			if i < 0 {
				return o, fmt.Errorf("-variants: unknown variant %q (use %s)", v, strings.Join(allVariants, ","))
			}
			o.variants = append(o.variants, allVariants[i])
		}
	}
	var errs []error
	if err := validateBenchSchema(o.schema); err != nil {
		errs = append(errs, fmt.Errorf("-schema: %w", err))
	}
	if o.messages < 1 || o.processRows < 1 || o.relayRows < 1 {
		errs = append(errs, errors.New("-messages, -process-rows and -relay-rows must be at least 1"))
	}
	if o.inFlight < 1 || o.inFlight > 256 {
		errs = append(errs, errors.New("-inflight must be between 1 and 256"))
	}
	if o.inboxWorkers < 1 || o.inboxWorkers > 64 {
		errs = append(errs, errors.New("-inbox-workers must be between 1 and 64"))
	}
	if o.relayBatch < 0 || o.relayBatch > 10000 || o.relayLanes < 1 || o.relayLanes > 256 {
		errs = append(errs, errors.New("-relay-batch must be between 0 and 10000, -relay-lanes between 1 and 256"))
	}
	if o.e2eSQLBatch < 0 || o.e2eSQLBatch > 1000 || o.e2ePartitions < 0 || o.e2ePartitions > 1000 {
		errs = append(errs, errors.New("-e2e-sql-batch and -e2e-partitions must be between 0 (the broker's default) and 1000"))
	}
	if o.sqlBatch < 1 || o.sqlBatch > 10000 {
		errs = append(errs, errors.New("-sql-batch must be between 1 and 10000"))
	}
	if o.inboxTxBatch < 1 || o.inboxTxBatch > 5000 {
		errs = append(errs, errors.New("-inbox-txbatch must be between 1 and 5000"))
	}
	if o.rounds < 1 || o.rounds > 9 {
		errs = append(errs, errors.New("-rounds must be between 1 and 9"))
	}
	if o.preload < 0 {
		errs = append(errs, errors.New("-preload must not be negative"))
	}
	if o.e2eDuration < 100*time.Millisecond || o.idleWindow < 100*time.Millisecond {
		errs = append(errs, errors.New("-e2e-duration and -idle-window must be at least 100ms"))
	}
	return o, errors.Join(errs...)
}

type harness struct {
	opts   options
	dsn    string
	db     *sql.DB
	logger watermill.LoggerAdapter
	out    io.Writer
	runID  string
}

func (h *harness) printf(format string, args ...any) { fmt.Fprintf(h.out, format, args...) }

func (h *harness) wants(v string) bool { return slices.Contains(h.opts.variants, v) }

// run executes the selected variants and returns the report.
func run(ctx context.Context, o options, out io.Writer) (*Report, error) {
	dsn, err := withAppName(o.databaseURL)
	if err != nil {
		return nil, err
	}
	// Subscriber transactions (SQL broker), handler transactions and group workers at once:
	// 2 x in flight + 24, within what the server has free.
	conns, err := connectionBudget(ctx, dsn, 2*o.inFlight+24)
	if err != nil {
		return nil, err
	}
	if conns.Pool < 2*o.inFlight+24 {
		inFlight := max(1, (conns.Pool-24)/2)
		fmt.Fprintf(out, "PostgreSQL has %d of %d connections free: pool %d, -inflight %d lowered to %d\n", conns.Free, conns.Max, conns.Pool, o.inFlight, inFlight)
		o.inFlight = inFlight
	}
	db, err := pgtx.Open(ctx, dsn, pgtx.PoolConfig{MaxOpenConns: conns.Pool})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	h := &harness{opts: o, dsn: dsn, db: db, out: out, runID: hex.EncodeToString(b), logger: errorLogger{}}
	if o.verbose {
		h.logger = watermill.NewStdLogger(true, false)
	}
	rep := &Report{Machine: describeMachine(ctx, db), Config: describeConfig(o)}
	rep.Config.Connections = conns
	h.printf("watermill-once bench %s: %d CPUs (%s), PostgreSQL %s, %s, load %s\n",
		h.runID, rep.Machine.CPUs, rep.Machine.Model, rep.Machine.PostgreSQL, rep.Machine.GoVersion, rep.Machine.LoadAvgStart)
	if err := prepareSchema(ctx, db, o.schema, o.preload, o.rebuildPreload, h.printf); err != nil {
		return nil, err
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return nil, err
		}
	}
	var embedded *embeddedkafka.Broker
	defer func() {
		if embedded != nil {
			embedded.Close()
		}
	}()
	for round := 1; round <= o.rounds && ctx.Err() == nil; round++ {
		if o.rounds > 1 {
			h.printf("=== round %d of %d (load %s)\n", round, o.rounds, loadAverage())
		}
		record := func(res Result, err error) {
			switch {
			case errors.Is(err, errSkip):
				return
			case err != nil:
				res.Error = err.Error()
				h.printf("%-8s %-16s ERROR %v\n", res.Broker, res.Variant, err)
			default:
				h.printf("%s\n", res.line())
			}
			res.Round = round
			rep.Rounds = append(rep.Rounds, res)
		}
		if err := h.round(ctx, dsn, fmt.Sprint(round), rep, record, &embedded); err != nil {
			return nil, err
		}
	}
	rep.Results = medians(rep.Rounds)
	rep.Machine.LoadAvgEnd = loadAverage()
	rep.Ratios = ratios(rep.Results)
	if o.rounds > 1 {
		h.printf("\nMedian of %d rounds:\n", o.rounds)
		for _, r := range rep.Results {
			h.printf("%s\n", r.line())
		}
	}
	h.printf("\n%s\n", rep.ratioText())
	h.printf("load average at start %s, at end %s\n", rep.Machine.LoadAvgStart, rep.Machine.LoadAvgEnd)
	return rep, ctx.Err()
}

// round measures every selected variant once.
func (h *harness) round(ctx context.Context, dsn, round string, rep *Report, record func(Result, error), embedded **embeddedkafka.Broker) error {
	o := h.opts
	var err error
	for _, id := range []string{C1Single, C1Batch} {
		if h.wants(id) && ctx.Err() == nil {
			record(h.ceiling(ctx, id))
		}
	}
	if h.wants(B5Ingest) && ctx.Err() == nil {
		record(h.ingestBurst(ctx))
	}
	for _, id := range []string{B5Process, B7Process} {
		if h.wants(id) && ctx.Err() == nil {
			record(h.process(ctx, id))
		}
	}

	if slices.ContainsFunc(idleVariants, h.wants) && ctx.Err() == nil {
		results, err := h.idleQueries(ctx)
		if err != nil {
			record(Result{Variant: "idle", Broker: "postgres"}, err)
		}
		for _, res := range results {
			record(res, nil)
		}
	}

	type rigKind struct {
		kind   broker.Kind
		legacy bool
	}
	var kinds []rigKind
	for _, kind := range o.brokers {
		if (kind == broker.AMQP && o.amqpCompare) || (kind == broker.SQL && o.sqlCompare) {
			kinds = append(kinds, rigKind{kind, true})
		}
		kinds = append(kinds, rigKind{kind, false})
	}
	for _, rk := range kinds {
		kind := rk.kind
		if ctx.Err() != nil {
			break
		}
		runID := h.runID + round + string(kind[0])
		if rk.legacy {
			runID += "l"
		}
		ro := rigOptions{kind: kind, databaseURL: dsn, schema: o.schema, runID: runID, inFlight: o.inFlight, sqlBatch: o.sqlBatch, legacyAMQP: rk.legacy}
		for _, v := range consumingVariants {
			if h.wants(v) && (v != B6 || kind == broker.SQL) {
				ro.variants = append(ro.variants, v)
			}
		}
		wantRelay := h.wants(Relay) || h.wants(RelayLane) || h.wants(Forwarder)
		if wantRelay {
			rt, ft := relayTopics(ro.runID)
			ro.relayTopics = []string{rt, ft}
		}
		var e2e []string
		for _, v := range latencyVariants {
			if h.wants(v) {
				e2e = append(e2e, v)
				ro.extraSubs = append(ro.extraSubs, broker.Subscription{Topic: e2eTopic(ro.runID, v), Group: "e2e-" + v})
			}
		}
		if len(ro.variants) == 0 && !wantRelay && len(e2e) == 0 {
			continue
		}
		if kind == broker.Kafka {
			if v := os.Getenv(broker.EnvKafkaBrokers); v != "" {
				ro.kafkaAddrs = strings.Split(v, ",")
				ro.kafkaNote = "Kafka at " + v
			} else {
				if *embedded == nil {
					if *embedded, err = embeddedkafka.Start(ctx, nil); err != nil {
						return err
					}
				}
				ro.kafkaAddrs = (*embedded).Addrs()
				ro.kafkaNote = "embedded kfake (in this process)"
			}
			rep.Machine.Kafka = ro.kafkaNote
		}
		r, err := newRig(ctx, h.db, ro, h.logger)
		if err != nil {
			record(Result{Variant: "setup", Broker: string(kind)}, err)
			continue
		}
		if kind == broker.AMQP {
			rep.Machine.RabbitMQ = r.cfg.AMQP.URL[strings.LastIndex(r.cfg.AMQP.URL, "@")+1:]
		}
		h.printf("--- %s: %s\n", kind, r.note)
		if len(ro.variants) > 0 {
			start := time.Now()
			if err := r.publishAll(ctx, o.messages); err != nil {
				record(Result{Variant: "publish", Broker: r.label()}, err)
				_ = r.close(context.WithoutCancel(ctx))
				continue
			}
			h.printf("published %d messages in %s\n", o.messages, time.Since(start).Round(time.Millisecond))
		}
		for _, v := range ro.variants {
			if ctx.Err() != nil {
				break
			}
			record(h.consume(ctx, r, v))
		}
		if wantRelay && ctx.Err() == nil {
			results, err := h.relayVsForwarder(ctx, r)
			if err != nil {
				record(Result{Variant: Relay, Broker: r.label()}, err)
			}
			for _, res := range results {
				if h.wants(res.Variant) {
					record(res, nil)
				}
			}
		}
		for _, v := range e2e {
			if ctx.Err() != nil {
				break
			}
			record(h.endToEnd(ctx, r, v))
		}
		if err := r.close(context.WithoutCancel(ctx)); err != nil {
			h.printf("cleanup of %s: %v\n", kind, err)
		}
	}
	return nil
}

// errorLogger prints only errors, to stderr.
type errorLogger struct{ fields watermill.LogFields }

// quiet silences errorLogger while components shut down.
var quiet atomic.Bool

func (l errorLogger) Error(msg string, err error, fields watermill.LogFields) {
	if quiet.Load() {
		return
	}
	fmt.Fprintf(os.Stderr, "ERROR %s: %v %v\n", msg, err, l.fields.Add(fields))
}
func (errorLogger) Info(string, watermill.LogFields)  {}
func (errorLogger) Debug(string, watermill.LogFields) {}
func (errorLogger) Trace(string, watermill.LogFields) {}
func (l errorLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return errorLogger{l.fields.Add(fields)}
}
