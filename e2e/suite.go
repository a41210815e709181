package e2e

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e/internal/scenario"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Target is one broker under test.
type Target struct {
	// Name labels the report.
	Name string
	// Config returns a broker configuration isolated for one test (unique vhost, topic tables in
	// the test's schema, ...). schema is the test's PostgreSQL schema.
	Config func(t *testing.T, schema string) broker.Config
	// BreakConnections, when set, makes the broker drop every client connection of cfg (all
	// of them, consumers and relay alike) and returns how many it closed.
	BreakConnections func(t *testing.T, cfg broker.Config) (int, error)
	// KillBroker, when set, kills the broker process with SIGKILL (nothing is flushed or shut
	// down cleanly; every client connection drops) and returns a function that starts it again
	// and waits until it serves. Run restarts it while the stream flows; KillBroker itself must
	// make sure the broker runs again when the test ends, even if it fails (t.Cleanup).
	KillBroker func(t *testing.T) (restart func(t *testing.T))
	// Describe, when set, returns a line naming what ran (e.g. the broker's release), logged
	// with the results.
	Describe func(t *testing.T, cfg broker.Config) string
}

// Defaults of Options; DefaultProducers and DefaultPace serve CounterOptions and ChaosOptions
// too.
const (
	DefaultEvents    = 300
	DefaultProducers = 4
	DefaultTimeout   = 3 * time.Minute
	DefaultPace      = 40 * time.Millisecond
)

// Options sizes a run.
type Options struct {
	// ConsumerBinary is the path of the built e2e/internal/consumer command. Required.
	ConsumerBinary string
	// Events is how many events the producers commit (one more, the poison, is added).
	// Default DefaultEvents (300).
	Events int
	// Producers run concurrently. Default DefaultProducers (4).
	Producers int
	// Timeout bounds the whole run. Default DefaultTimeout (3 minutes).
	Timeout time.Duration
	// Pace is each producer's pause between events, so that faults hit a stream that is still
	// flowing. Default DefaultPace (40ms: 300 events from 4 producers take about 3 seconds).
	Pace time.Duration
}

func (o *Options) setDefaults() {
	o.Events = cmp.Or(o.Events, DefaultEvents)
	o.Producers = cmp.Or(o.Producers, DefaultProducers)
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout)
	o.Pace = cmp.Or(o.Pace, DefaultPace)
}

// Run is the fault suite of watermill-once's guarantee, for one broker. It checks that every
// event committed by a producer is applied exactly once, and that a poison event is parked
// visibly without blocking the others, while:
//
//   - producers commit an order and its OrderPlaced event in one transaction (outbox);
//   - the relay publishes to the broker through a publisher that, every third call, publishes
//     and then reports failure, exactly like a relay crashing before recording its position,
//     so the relay republishes (the run asserts that at least 10% of the events were);
//   - two consumer processes in one consumer group share the database, one with the
//     per-message handler, the other with a batch handler (once.BatchHandler) of the same effect;
//   - each of them is killed with SIGKILL mid-stream and restarted;
//   - every PostgreSQL connection of the application (producers, relay, consumers) is
//     terminated with pg_terminate_backend mid-stream;
//   - the broker drops every client connection, where Target.BreakConnections can make it;
//   - the broker process is killed with SIGKILL mid-stream and started again, where
//     Target.KillBroker can do it (the relay's publishes fail and are retried, consumer
//     sessions break and rejoin).
//
// "Exactly once" is checked in the database: one ledger row per event (the ledger has no unique
// constraint that could hide a double application), ledger count and sum equal to the orders',
// and one dedupe claim per applied event. The log reports messages produced, deliveries,
// duplicates absorbed and faults injected.
func Run(t *testing.T, target Target, opts Options) {
	pgtest.SkipShort(t) // before the commands are asked for: a -short run builds none
	opts.setDefaults()
	require.NotEmpty(t, opts.ConsumerBinary, "Options.ConsumerBinary: build e2e/internal/consumer first")
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()

	topic, poisonTopic, group := pgtest.NewName("orders"), pgtest.NewName("parked"), "ledger"
	r := newRig(ctx, t, target, "e2e_app", outbox.RelayConfig{
		BatchSize: 10, PollInterval: 20 * time.Millisecond,
		Backoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, StandbyInterval: 100 * time.Millisecond,
	}, broker.Subscription{Topic: topic, Group: group}, broker.Subscription{Topic: poisonTopic, Group: "ops"})
	control, appDB, schema, appName, cfg, writer, crashy, relay := r.control, r.app, r.schema, r.appName, r.cfg, r.writer, r.crashy, r.relay
	fleet := r.fleet(t, opts.ConsumerBinary, target.Name+"-"+appName,
		scenario.EnvTopic+"="+topic, scenario.EnvPoisonTopic+"="+poisonTopic, scenario.EnvGroup+"="+group)
	fleet.envOf = batchConsumer
	a, c := fleet.start("a"), fleet.start("b")

	// Producers, with faults injected at fixed points of the stream.
	var produced atomic.Int64
	var faults faultLog
	poisonID := "poison-" + watermill.NewShortUUID()
	prodErr := make(chan error, opts.Producers)
	var producers sync.WaitGroup
	perProducer := opts.Events / opts.Producers
	total := perProducer * opts.Producers
	for p := range opts.Producers {
		producers.Add(1)
		go func() {
			defer producers.Done()
			for i := range perProducer {
				id := fmt.Sprintf("o-%d-%05d", p, i)
				ev := scenario.Event{OrderID: id, Amount: int64(100 + (p*perProducer+i)%997)}
				if err := scenario.Produce(ctx, appDB, writer, schema, topic, ev, fmt.Sprintf("customer-%d", i%7)); err != nil {
					prodErr <- err
					return
				}
				produced.Add(1)
				time.Sleep(opts.Pace)
			}
		}()
	}
	applied := func() int {
		return pgtest.Count(t, control, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "ledger"))
	}
	// waitProgress waits until n events were produced and m applied: the faults hit consumers
	// that are working and a stream that is still flowing.
	waitProgress := func(n, m int) {
		require.Eventually(t, func() bool { return produced.Load() >= int64(n) && applied() >= m }, opts.Timeout, 10*time.Millisecond,
			"progress: want %d produced and %d applied; consumer logs: %s", n, m, fleet.logTails())
	}

	waitProgress(total/4, total/10)
	faults.add("SIGKILL consumer a mid-stream (%d produced, %d applied), restarted", produced.Load(), applied())
	a = fleet.kill(a)

	waitProgress(total/2, total/4)
	require.NoError(t, scenario.Produce(ctx, appDB, writer, schema, topic, scenario.Event{OrderID: poisonID, Amount: 999_999, Poison: true}, "customer-0"))
	var terminated int
	require.NoError(t, control.QueryRowContext(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) x`, appName).Scan(&terminated))
	faults.add("pg_terminate_backend of every application connection (%d terminated) at %d produced", terminated, produced.Load())

	if target.KillBroker != nil {
		// Right after the database fault, half-way through production: the relay is still
		// publishing. The broker stays down until the producers committed more events
		// (the outbox keeps them), so the relay fails against a dead broker before it comes
		// back; consumers lose their sessions and offset commits.
		atKill, appliedAtKill := produced.Load(), applied()
		restart := target.KillBroker(t)
		killedAt := time.Now()
		faults.add("SIGKILL of the broker process mid-stream (%d produced, %d applied)", atKill, appliedAtKill)
		downUntil := min(atKill+int64(total/20), int64(total))
		require.Eventually(t, func() bool { return produced.Load() >= downUntil }, opts.Timeout, 10*time.Millisecond,
			"producers stalled while the broker was down")
		restart(t)
		faults.add("broker restarted and serving after %s down (%d produced meanwhile, %d applied at restart)",
			time.Since(killedAt).Round(time.Millisecond), produced.Load()-atKill, applied())
	}
	waitProgress(total*3/4, total/2)
	if target.BreakConnections != nil {
		n, err := target.BreakConnections(t, cfg)
		require.NoError(t, err)
		faults.add("broker closed all %d client connections at %d produced", n, produced.Load())
	}
	faults.add("SIGKILL consumer b mid-stream (%d produced, %d applied), restarted", produced.Load(), applied())
	c = fleet.kill(c)

	producers.Wait()
	close(prodErr)
	for err := range prodErr {
		require.NoError(t, err)
	}
	producedIn := time.Since(began)

	// Everything arrives: wait for the ledger to hold every event, then for the stream to stay
	// quiet long enough for any late copy to have landed.
	require.Eventually(t, func() bool { return applied() >= total }, opts.Timeout, 50*time.Millisecond,
		"every event applied (%d of %d so far); consumer logs: %s", applied(), total, fleet.logTails())
	// The poison event too: after a broker restart its partition's consumer may rejoin the
	// group later than the others, so a quiet stream alone does not mean it was handled.
	require.Eventually(t, func() bool {
		return pgtest.Count(t, control, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE payload->>'destination_topic' = $1`, poisonTopic) > 0
	}, opts.Timeout, 50*time.Millisecond, "the poison event parked; consumer logs: %s", fleet.logTails())
	for _, f := range faults.list() { // before the checks, so a failing run shows them too
		t.Logf("e2e[%s] fault injected: %s", target.Name, f)
	}
	quietSince, last := time.Now(), fleet.deliveries()
	require.Eventually(t, func() bool {
		if d := fleet.deliveries(); d != last {
			last, quietSince = d, time.Now()
		}
		return time.Since(quietSince) > 1500*time.Millisecond && crashy.idleFor() > time.Second
	}, opts.Timeout, 50*time.Millisecond)
	fleet.stop(a)
	fleet.stop(c)
	require.NoError(t, relay.Close())

	// Exactly once, in the database.
	q := func(query string, args ...any) int { return pgtest.Count(t, control, query, args...) }
	ledger, orders := pgtx.QualifiedName(schema, "ledger"), pgtx.QualifiedName(schema, "orders")
	rows, distinct := q(`SELECT count(*) FROM `+ledger), q(`SELECT count(DISTINCT event_id) FROM `+ledger)
	lost := q(`SELECT count(*) FROM `+orders+` o WHERE id <> $1 AND NOT EXISTS (SELECT 1 FROM `+ledger+` l WHERE l.order_id = o.id)`, poisonID)
	twice := q(`SELECT count(*) FROM (SELECT event_id FROM ` + ledger + ` GROUP BY event_id HAVING count(*) > 1) d`)
	t.Logf("e2e[%s] result: %d events produced, %d applied, %d lost, %d applied twice", target.Name, total, distinct, lost, twice)
	require.Zero(t, lost, "nothing lost")
	require.Zero(t, twice, "no event applied twice")
	require.Equal(t, total, rows, "one ledger row per produced event")
	require.Equal(t, rows, distinct, "no event applied twice")
	require.Equal(t, total+1, q(`SELECT count(*) FROM `+orders), "every producer transaction committed once")
	ledgerSum := q(`SELECT coalesce(sum(amount), 0)::bigint FROM ` + ledger)
	require.Equal(t, q(`SELECT sum(amount)::bigint FROM `+orders+` WHERE id <> $1`, poisonID), ledgerSum, "ledger sum equals orders sum")
	require.Equal(t, total, q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")+` WHERE consumer = $1 AND message_id NOT LIKE 'wmonce-retry/%'`, group), "one dedupe claim per applied event")
	require.Positive(t, q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")+` WHERE consumer = $1 AND message_id LIKE 'wmonce-retry/%'`, group), "events that needed time went through delayed retries")

	// The poison event: parked in the outbox for the poison topic, never applied or claimed.
	poisonUUID := "evt-" + poisonID
	require.Zero(t, q(`SELECT count(*) FROM `+ledger+` WHERE event_id = $1`, poisonUUID), "poison not applied")
	require.Zero(t, q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")+` WHERE message_id = $1`, poisonUUID))
	require.Equal(t, 1, q(`SELECT count(DISTINCT uuid) FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE payload->>'destination_topic' = $1`, poisonTopic),
		"exactly the poison event is parked; parked: %s", parked(t, control, schema, poisonTopic))
	// Each delivered copy of the poison event is parked (the relay may have published it twice):
	// the same UUID, so whoever works the poison topic can tell copies apart.
	parkedCopies := q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE payload->>'destination_topic' = $1 AND uuid = $2`, poisonTopic, poisonUUID)
	require.GreaterOrEqual(t, parkedCopies, 1, "the poison event is parked")

	// The relay really republished, and the consumers really absorbed copies.
	pubStats := crashy.stats()
	require.GreaterOrEqual(t, float64(pubStats.republishedEvents), 0.10*float64(total+1), "the relay republished at least 10%% of the events")
	st := fleet.totals()
	require.Positive(t, st.Duplicates, "copies reached the consumers and were absorbed")

	t.Logf("e2e[%s] produced %d events + 1 poison in %s by %d producers (one transaction each: order row + outbox event)",
		target.Name, total, producedIn.Round(time.Millisecond), opts.Producers)
	t.Logf("e2e[%s] relay: %d messages published, %d events republished (%.0f%%) after %d simulated crashes between publish and position update",
		target.Name, pubStats.published, pubStats.republishedEvents, 100*float64(pubStats.republishedEvents)/float64(total+1), pubStats.crashes)
	t.Logf("e2e[%s] consumers (%d process runs): %d deliveries, %d fresh, %d duplicates absorbed, %d attempts rolled back (middleware Counters; runs killed with SIGKILL count up to their last report, at most 100ms before the kill)",
		target.Name, fleet.runs(), st.Deliveries, st.Applied, st.Duplicates, st.Failed)
	t.Logf("e2e[%s] events applied by the per-message consumer a: %d, by the batch consumer b: %d",
		target.Name, q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "ledger")+` WHERE instance = 'a'`),
		q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "ledger")+` WHERE instance = 'b'`))
	if target.Describe != nil {
		t.Logf("e2e[%s] broker: %s", target.Name, target.Describe(t, cfg))
	}
	t.Logf("e2e[%s] verified: ledger %d rows = %d distinct events = %d produced, sum %d = orders sum, %d claims; poison %s parked (%d delivered copies parked under its one UUID), not applied; total %s",
		target.Name, rows, distinct, total, ledgerSum, total, poisonUUID, parkedCopies, time.Since(began).Round(time.Millisecond))
}

// rig is what a run sets up before its consumers start: the test's schema with the scenario's
// tables, a control pool for bookkeeping and fault injection that is never terminated, the
// application's pool (its connections carry appName, which the fault injector targets), the
// broker with the run's subscriptions declared, and a relay publishing the outbox through a
// crashingPublisher that republishes every third call.
type rig struct {
	control, app    *sql.DB
	schema, appName string
	cfg             broker.Config
	writer          *outbox.Writer
	crashy          *crashingPublisher
	relay           *outbox.Relay
}

// newRig sets up a run on target. relayCfg's Schema is set to the test's; the relay stops
// when ctx ends or the test does.
func newRig(ctx context.Context, t *testing.T, target Target, appPrefix string, relayCfg outbox.RelayConfig, subs ...broker.Subscription) *rig {
	t.Helper()
	r := &rig{control: pgtest.DB(t), appName: pgtest.NewName(appPrefix)}
	r.schema = pgtest.Schema(t, r.control)
	require.NoError(t, scenario.CreateTables(ctx, r.control, r.schema))
	appURL := withApplicationName(t, pgtest.URL(), r.appName)
	var err error
	r.app, err = pgtx.Open(ctx, appURL, pgtx.PoolConfig{MaxOpenConns: 8})
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.app.Close() })

	r.cfg = target.Config(t, r.schema)
	r.cfg.DatabaseURL = appURL
	r.cfg.Subscriptions = subs
	b, err := broker.New(ctx, r.app, r.cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	brokertest.DeleteCreatedKafkaTopics(t, b)
	pub, err := b.NewPublisher(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	r.writer, err = outbox.NewWriter(outbox.Config{Schema: r.schema, ValidateTopic: broker.TopicValidator(r.cfg.Kind)})
	require.NoError(t, err)
	r.crashy = &crashingPublisher{next: pub, every: 3, published: map[string]int{}}
	relayCfg.Schema = r.schema
	r.relay, err = outbox.NewRelay(r.app, r.crashy, relayCfg, watermill.NopLogger{})
	require.NoError(t, err)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = r.relay.Run(ctx) }()
	t.Cleanup(func() { _ = r.relay.Close(); <-relayDone })
	return r
}

// batchConsumer is the consumer process, of the two, whose handler is a once.BatchHandler with
// the same effect (scenario.BatchHandler, one multi-row INSERT per batch): the batch path is
// held to the same checks, next to the per-message path, in one consumer group.
var batchConsumer = map[string][]string{"b": {scenario.EnvHandler + "=" + scenario.HandlerBatch}}

// fleet returns a fleet of consumer processes of bin on the rig's broker and schema, with the
// scenario's variables env, logging into a temporary directory, or into E2E_LOG_DIR/logName
// when E2E_LOG_DIR is set (kept for a post-mortem). Its processes are killed when the test ends.
func (r *rig) fleet(t *testing.T, bin, logName string, env ...string) *fleet {
	t.Helper()
	logDir := t.TempDir()
	if d := os.Getenv("E2E_LOG_DIR"); d != "" {
		logDir = filepath.Join(d, logName)
		require.NoError(t, os.MkdirAll(logDir, 0o755))
		t.Logf("consumer logs in %s", logDir)
	}
	f := &fleet{t: t, bin: bin, dir: logDir, env: append(append(r.cfg.Environ(), scenario.EnvSchema+"="+r.schema), env...)}
	t.Cleanup(f.killAll)
	return f
}

// parked lists what was parked for the poison topic, with the reasons.
func parked(t *testing.T, db *sql.DB, schema, topic string) string {
	rows, err := db.QueryContext(t.Context(), `SELECT uuid, coalesce(metadata->>'reason_poisoned', '') FROM `+pgtx.QualifiedName(schema, "outbox")+` WHERE payload->>'destination_topic' = $1`, topic)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var uuid, reason string
		require.NoError(t, rows.Scan(&uuid, &reason))
		out = append(out, uuid+" ("+reason+")")
	}
	require.NoError(t, rows.Err())
	return strings.Join(out, "; ")
}

func withApplicationName(t *testing.T, raw, name string) string {
	u, err := url.Parse(raw)
	require.NoError(t, err, "DATABASE_URL must be a postgres:// URL for the e2e suite")
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

type faultLog struct {
	mu sync.Mutex
	l  []string
}

func (f *faultLog) add(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.l = append(f.l, fmt.Sprintf(format, args...))
}

func (f *faultLog) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.l...)
}

// crashingPublisher publishes every call to the broker and, on every every-th call, then
// returns an error: from the relay's side this is a crash after publishing and before recording
// the position, so it publishes the same messages again.
type crashingPublisher struct {
	next  message.Publisher
	every int

	mu        sync.Mutex
	calls     int
	crashes   int
	total     int
	published map[string]int
	lastCall  time.Time
}

var errSimulatedCrash = fmt.Errorf("e2e: simulated relay crash after publishing, before recording the position")

func (p *crashingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.next.Publish(topic, msgs...); err != nil {
		p.touch()
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastCall = time.Now()
	p.calls++
	for _, m := range msgs {
		p.published[m.UUID]++
		p.total++
	}
	if p.calls%p.every == 0 {
		p.crashes++
		return errSimulatedCrash
	}
	return nil
}

func (p *crashingPublisher) touch() {
	p.mu.Lock()
	p.lastCall = time.Now()
	p.mu.Unlock()
}

func (p *crashingPublisher) Close() error { return nil }

func (p *crashingPublisher) idleFor() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Since(p.lastCall)
}

type publisherStats struct{ published, republishedEvents, crashes int }

func (p *crashingPublisher) stats() publisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := publisherStats{published: p.total, crashes: p.crashes}
	for _, n := range p.published {
		if n > 1 {
			s.republishedEvents++
		}
	}
	return s
}

// fleet runs consumer processes and keeps the last totals each run reported.
type fleet struct {
	t   *testing.T
	bin string
	dir string
	env []string
	// envOf adds variables for the processes of one name (the batch consumer: batchConsumer).
	envOf map[string][]string
	// onLine, when set, sees each stdout line that is not a stats report first; it returns
	// true when it consumed the line (it is then not copied to the process log).
	onLine func(line string) bool

	mu       sync.Mutex
	finished []scenario.Stats // runs that ended
	running  map[*proc]bool
	nruns    int
}

type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}

	mu   sync.Mutex
	last scenario.Stats
}

func (f *fleet) start(name string) *proc {
	f.t.Helper()
	f.mu.Lock()
	f.nruns++
	run := f.nruns
	if f.running == nil {
		f.running = map[*proc]bool{}
	}
	f.mu.Unlock()
	p := &proc{name: name, done: make(chan struct{}), logPath: filepath.Join(f.dir, fmt.Sprintf("%s-%s-run%d.log", filepath.Base(f.bin), name, run))}
	logFile, err := os.Create(p.logPath)
	require.NoError(f.t, err)
	p.cmd = exec.Command(f.bin) //nolint:noctx // the fixture starts, kills and reaps its processes itself: a context would kill them behind its back
	p.cmd.Env = append(append(append(os.Environ(), f.env...), f.envOf[name]...), scenario.EnvInstance+"="+name)
	p.cmd.Stderr = logFile
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(f.t, err)
	require.NoError(f.t, p.cmd.Start(), "start consumer process")
	go func() {
		defer close(p.done)
		defer logFile.Close()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if s, ok := strings.CutPrefix(line, scenario.StatsPrefix); ok {
				var st scenario.Stats
				if json.Unmarshal([]byte(s), &st) == nil {
					p.mu.Lock()
					p.last = st
					p.mu.Unlock()
				}
				continue
			}
			if f.onLine != nil && f.onLine(line) {
				continue
			}
			fmt.Fprintln(logFile, line)
		}
		_ = p.cmd.Wait()
	}()
	f.mu.Lock()
	f.running[p] = true
	f.mu.Unlock()
	return p
}

// kill sends SIGKILL (no cleanup, no final report, connections dropped mid-transaction) and
// starts a new process of the same name.
func (f *fleet) kill(p *proc) *proc {
	f.t.Helper()
	require.NoError(f.t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
	f.retire(p)
	return f.start(p.name)
}

// stop asks for a clean exit and fails the test if the process does not exit cleanly.
func (f *fleet) stop(p *proc) {
	f.t.Helper()
	select {
	case <-p.done:
		f.retire(p)
		f.t.Fatalf("consumer %s exited before it was stopped (%v); log:\n%s", p.name, p.cmd.ProcessState, tail(p.logPath))
	default:
	}
	require.NoError(f.t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		f.t.Errorf("consumer %s did not stop within 30s of SIGTERM", p.name)
	}
	f.retire(p)
	require.True(f.t, p.cmd.ProcessState.Success(), "consumer %s exited with %v; log:\n%s", p.name, p.cmd.ProcessState, tail(p.logPath))
	require.True(f.t, p.stats().Final, "consumer %s printed its final report", p.name)
}

func (f *fleet) retire(p *proc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running[p] {
		delete(f.running, p)
		f.finished = append(f.finished, p.stats())
	}
}

func (f *fleet) killAll() {
	f.mu.Lock()
	procs := make([]*proc, 0, len(f.running))
	for p := range f.running {
		procs = append(procs, p)
	}
	f.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Kill()
		<-p.done
		f.retire(p)
	}
}

func (p *proc) stats() scenario.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

func (f *fleet) all() []scenario.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]scenario.Stats(nil), f.finished...)
	for p := range f.running {
		out = append(out, p.stats())
	}
	return out
}

func (f *fleet) totals() scenario.Stats {
	var s scenario.Stats
	for _, r := range f.all() {
		s.Deliveries += r.Deliveries
		s.Applied += r.Applied
		s.Duplicates += r.Duplicates
		s.Failed += r.Failed
	}
	return s
}

func (f *fleet) deliveries() uint64 { return f.totals().Deliveries }

func (f *fleet) runs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nruns
}

func (f *fleet) logTails() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for p := range f.running {
		fmt.Fprintf(&b, "\n--- consumer %s (%s):\n%s", p.name, p.logPath, tail(p.logPath))
	}
	return b.String()
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	text := string(b)
	if i := strings.Index(text, "WARNING: DATA RACE"); i >= 0 {
		text = text[i:] // the race report matters more than the last lines
		if lines := strings.Split(text, "\n"); len(lines) > 80 {
			text = strings.Join(lines[:80], "\n")
		}
		return text
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}
