// Package restore_test is the backup-and-restore test (issue 35): the pipeline outbox.Writer ->
// Relay -> the SQL broker -> two consumer groups (the Stack middleware, and inbox.Receiver +
// Processor) with work left at every stage, pg_dump -Fc of its schemas and pg_restore into a
// second PostgreSQL cluster (e2e/services up pg-restore: 127.0.0.1:5433, created afresh, so
// its transaction counter is far below the main cluster's), new events written during the
// stall, the checks, the rebase, and every event applied exactly once by both consumer kinds;
// then the same dump restored into that cluster once its counter is above the source's, where
// nothing needs rebasing and nothing is delivered twice. RESTORE_DATABASE_URL overrides the
// second cluster (any database of it: the test creates one per restore).
package restore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/sqlrebase"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// defaultRestoreURL is the cluster e2e/services up pg-restore creates.
const defaultRestoreURL = "postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable"

const topic = "events"

// The stages of the probe, and their events.
type stage struct {
	name   string
	events int
}

var stages = []stage{
	{"applied", 300},    // fully applied by both groups at the dump
	{"inbox", 200},      // applied by the Stack group, stored but not processed in the inbox
	{"broker", 200},     // forwarded to the SQL broker, consumed by neither group
	{"outbox", 200},     // in the outbox, not forwarded
	{"new-outbox", 300}, // written through outbox.Writer after the restore
	{"new-broker", 100}, // published into the SQL broker after the restore
}

func restoreURL() string {
	if u := os.Getenv("RESTORE_DATABASE_URL"); u != "" {
		return u
	}
	return defaultRestoreURL
}

// TestBackupRestore runs the probe on watermill-sql v4 and v3: first each restored into the
// fresh cluster (lower counter), then the same dumps into it once its counter passed the
// source's (higher counter).
func TestBackupRestore(t *testing.T) {
	pgtest.SkipShort(t)
	for _, tool := range []string{"pg_dump", "pg_restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: install PostgreSQL's client programs (Debian: apt-get install postgresql-client)", tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	admin := openRestoreCluster(ctx, t)
	source := pgtest.OpenDB(t, 24)
	if target, src := nextXid(ctx, t, admin), nextXid(ctx, t, source); target >= src {
		t.Fatalf("the cluster at %s must start with a lower transaction counter than the source's (%d, not below %d): recreate it fresh with `bash e2e/services up pg-restore`", restoreURL(), target, src)
	}

	dumps := map[int]*dumped{}
	dir := t.TempDir() // the dumps outlive the subtests that make them
	cli := buildCLI(ctx, t, dir)
	for _, v := range []int{4, 3} {
		t.Run(fmt.Sprintf("v%d/lower-counter", v), func(t *testing.T) {
			d := buildSource(ctx, t, source, v, dir)
			dumps[v] = d
			require.Less(t, nextXid(ctx, t, admin), d.sourceXid,
				"the cluster at %s must have a lower transaction counter than the source's: recreate it (bash e2e/services up pg-restore)", restoreURL())
			runRestored(ctx, t, admin, cli, d, true)
		})
	}
	// Raise the second cluster's counter above the source's (one committed transaction each).
	target := nextXid(ctx, t, admin)
	src := nextXid(ctx, t, source) + 10_000
	if target < src {
		conn, err := admin.Conn(ctx)
		require.NoError(t, err)
		_, err = conn.ExecContext(ctx, `CREATE PROCEDURE pg_temp.burn(n bigint) LANGUAGE plpgsql AS $$
BEGIN FOR i IN 1..n LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`)
		require.NoError(t, err)
		_, err = conn.ExecContext(ctx, `CALL pg_temp.burn($1)`, int64(src-target))
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
	for _, v := range []int{4, 3} {
		t.Run(fmt.Sprintf("v%d/higher-counter", v), func(t *testing.T) {
			d := dumps[v]
			if d == nil {
				t.Fatal("the lower-counter run of this version did not produce a dump")
			}
			require.Greater(t, nextXid(ctx, t, admin), d.sourceXid)
			runRestored(ctx, t, admin, cli, d, false)
		})
	}
}

// openRestoreCluster connects to the second cluster, or fails saying how to start it.
func openRestoreCluster(ctx context.Context, t *testing.T) *sql.DB {
	t.Helper()
	db, err := pgtx.Open(ctx, restoreURL(), pgtx.PoolConfig{MaxOpenConns: 4})
	if err == nil {
		err = db.PingContext(ctx)
	}
	if err != nil {
		t.Fatalf("the second PostgreSQL cluster for the restore test does not answer at %s (%v): start it with `bash e2e/services up pg-restore` (a fresh cluster on 127.0.0.1:5433), or set RESTORE_DATABASE_URL", restoreURL(), err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func nextXid(ctx context.Context, t *testing.T, db *sql.DB) uint64 {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&s))
	n, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err)
	return n
}

// dumped is a source pipeline's state, dumped.
type dumped struct {
	version        int
	app, brokerSch string
	file           string
	sourceXid      uint64 // the source's next transaction id at the dump
	ids            map[string][]string
}

// pipeline is the probe's pipeline on one database.
type pipeline struct {
	t       *testing.T
	db      *sql.DB
	app     string
	bcfg    broker.Config
	b       *broker.Broker
	pub     message.Publisher
	writer  *outbox.Writer
	logs    *watermill.CaptureLoggerAdapter
	stops   map[string]func()
	mu      sync.Mutex
	deliver map[string]map[string]int // kind -> event -> deliveries
}

func newPipeline(ctx context.Context, t *testing.T, db *sql.DB, app, brokerSchema string, version int) *pipeline {
	t.Helper()
	p := &pipeline{t: t, db: db, app: app, logs: watermill.NewCaptureLogger(), stops: map[string]func(){},
		deliver: map[string]map[string]int{"stack": {}, "inbox": {}}}
	p.bcfg = broker.Config{Kind: broker.SQL}
	p.bcfg.SQL = broker.SQLConfig{WatermillSQL: version, Schema: brokerSchema, PollInterval: 20 * time.Millisecond, IdlePollInterval: 200 * time.Millisecond}
	p.bcfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "stack"}, {Topic: topic, Group: "inbox"}}
	var err error
	p.b, err = broker.New(ctx, db, p.bcfg, p.logs)
	require.NoError(t, err)
	p.pub, err = p.b.NewPublisher(ctx)
	require.NoError(t, err)
	p.writer, err = outbox.NewWriter(outbox.Config{Schema: app, ValidateTopic: broker.TopicValidator(broker.SQL)})
	require.NoError(t, err)
	t.Cleanup(p.close)
	return p
}

func (p *pipeline) close() {
	for name := range p.stops {
		p.stop(name)
	}
	_ = p.pub.Close()
	_ = p.b.Close()
}

func (p *pipeline) stop(name string) {
	if s := p.stops[name]; s != nil {
		s()
		delete(p.stops, name)
	}
}

// counting records each delivery to a consumer group before anything else sees it.
func (p *pipeline) counting(kind string) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			p.mu.Lock()
			p.deliver[kind][msg.UUID]++
			p.mu.Unlock()
			return h(msg)
		}
	}
}

// deliveries returns the most deliveries of one of ids to kind's group.
func (p *pipeline) deliveries(kind string, ids []string) (most int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		most = max(most, p.deliver[kind][id])
	}
	return most
}

func (p *pipeline) apply(kind string) func(*message.Message) ([]*message.Message, error) {
	table := pgtx.QualifiedName(p.app, "applied")
	return func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := pgtx.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the context")
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+table+` (kind, event_id) VALUES ($1, $2)`, kind, msg.UUID)
		return nil, err
	}
}

func (p *pipeline) runRouter(ctx context.Context, name string, build func(r *message.Router)) {
	t := p.t
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	build(r)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-r.Running():
	case <-done:
		t.Fatalf("router %s stopped at start", name)
	}
	p.stops[name] = func() { _ = r.Close(); <-done }
}

func (p *pipeline) startRelay(ctx context.Context) {
	relay, err := outbox.NewRelay(p.db, p.pub, outbox.RelayConfig{Schema: p.app, PollInterval: 20 * time.Millisecond, StandbyInterval: 200 * time.Millisecond}, p.logs)
	require.NoError(p.t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = relay.Run(context.WithoutCancel(ctx)) }()
	p.stops["relay"] = func() { _ = relay.Close(); <-done }
}

func (p *pipeline) startStack(ctx context.Context) {
	mw, err := once.New(p.db, once.Config{Schema: p.app, Consumer: "stack"}, p.logs)
	require.NoError(p.t, err)
	stack, err := once.Stack(once.StackConfig{Middleware: mw, Logger: p.logs})
	require.NoError(p.t, err)
	sub, err := p.b.NewSubscriber("stack")
	require.NoError(p.t, err)
	p.runRouter(ctx, "stack", func(r *message.Router) {
		h := r.AddConsumerHandler("stack", topic, sub, func(msg *message.Message) error {
			_, err := p.apply("stack")(msg)
			return err
		})
		h.AddMiddleware(append([]message.HandlerMiddleware{p.counting("stack")}, stack...)...)
	})
}

func (p *pipeline) startReceiver(ctx context.Context) {
	recv, err := inbox.NewReceiver(p.db, inbox.ReceiverConfig{Schema: p.app, Consumer: "inbox"}, p.logs)
	require.NoError(p.t, err)
	sub, err := p.b.NewSubscriber("inbox")
	require.NoError(p.t, err)
	p.runRouter(ctx, "receiver", func(r *message.Router) {
		r.AddConsumerHandler("inbox", topic, sub, recv.Handle).AddMiddleware(p.counting("inbox"))
	})
	stop := p.stops["receiver"]
	p.stops["receiver"] = func() { stop(); _ = recv.Close() }
}

func (p *pipeline) startProcessor(ctx context.Context) {
	proc, err := inbox.NewProcessor(p.db, p.apply("inbox"), inbox.ProcessorConfig{Schema: p.app, Consumer: "inbox", Outbox: p.writer}, p.logs)
	require.NoError(p.t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = proc.Run(context.WithoutCancel(ctx)) }()
	p.stops["processor"] = func() { _ = proc.Close(); <-done }
}

func (p *pipeline) startAll(ctx context.Context) {
	p.startRelay(ctx)
	p.startStack(ctx)
	p.startReceiver(ctx)
	p.startProcessor(ctx)
}

// write stores events through outbox.Writer, 50 to a transaction.
func (p *pipeline) write(ids []string) {
	pub := p.writer.DBPublisher(p.db)
	for len(ids) > 0 {
		n := min(50, len(ids))
		msgs := make([]*message.Message, n)
		for i, id := range ids[:n] {
			msgs[i] = message.NewMessage(id, []byte(`{}`))
		}
		require.NoError(p.t, pub.Publish(topic, msgs...))
		ids = ids[n:]
	}
}

// count returns how many rows of ids are in query's result (query selects event ids).
func (p *pipeline) count(ctx context.Context, query string, ids []string, args ...any) int {
	var n int
	require.NoError(p.t, p.db.QueryRowContext(ctx, `SELECT count(*) FROM (`+query+`) AS q(id) WHERE id = ANY($1)`,
		append([]any{"{" + strings.Join(ids, ",") + "}"}, args...)...).Scan(&n))
	return n
}

func (p *pipeline) applied(ctx context.Context, kind string, ids []string) int {
	return p.count(ctx, `SELECT DISTINCT event_id FROM `+pgtx.QualifiedName(p.app, "applied")+` WHERE kind = $2`, ids, kind)
}

func (p *pipeline) appliedRows(ctx context.Context, kind string, ids []string) int {
	return p.count(ctx, `SELECT event_id FROM `+pgtx.QualifiedName(p.app, "applied")+` WHERE kind = $2`, ids, kind)
}

func (p *pipeline) inBroker(ctx context.Context, ids []string) int {
	return p.count(ctx, `SELECT DISTINCT uuid FROM `+pgtx.QualifiedName(p.bcfg.SQL.Schema, "watermill_"+topic), ids)
}

// unacked counts the broker rows some consumer group has not acked yet (watermill-sql orders a
// topic by (transaction_id, offset)); -1 until both groups have an offsets row.
func (p *pipeline) unacked(ctx context.Context) int {
	offsets := pgtx.QualifiedName(p.bcfg.SQL.Schema, "watermill_offsets_"+topic)
	table := pgtx.QualifiedName(p.bcfg.SQL.Schema, "watermill_"+topic)
	var groups, n int
	require.NoError(p.t, p.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+offsets+`),
  (SELECT count(*) FROM `+offsets+` o JOIN `+table+` t
     ON (t.transaction_id, t."offset") > (o.last_processed_transaction_id, coalesce(o.offset_acked, 0)))`).Scan(&groups, &n))
	if groups < 2 {
		return -1
	}
	return n
}

func (p *pipeline) inOutbox(ctx context.Context, ids []string) int {
	return p.count(ctx, `SELECT DISTINCT uuid FROM `+pgtx.QualifiedName(p.app, "outbox"), ids)
}

func (p *pipeline) until(what string, cond func() bool) {
	testwait.UntilWithin(p.t, 90*time.Second, what, cond)
}

// buildSource runs the pipeline on the main cluster and leaves work at every stage, then dumps
// its schemas.
func buildSource(ctx context.Context, t *testing.T, db *sql.DB, version int, dir string) *dumped {
	d := &dumped{version: version, app: pgtest.Schema(t, db), ids: map[string][]string{}}
	d.brokerSch = d.app + "_broker"
	t.Cleanup(func() {
		_, _ = db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(d.brokerSch)+` CASCADE`)
	})
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(d.app, "applied")+` (kind text NOT NULL, event_id text NOT NULL)`)
	for _, s := range stages {
		for i := range s.events {
			d.ids[s.name] = append(d.ids[s.name], fmt.Sprintf("%s-%d", s.name, i))
		}
	}
	p := newPipeline(ctx, t, db, d.app, d.brokerSch, version)
	p.startAll(ctx)
	p.write(d.ids["applied"])
	p.until("stage 1 applied by both groups", func() bool {
		return p.applied(ctx, "stack", d.ids["applied"]) == 300 && p.applied(ctx, "inbox", d.ids["applied"]) == 300
	})
	p.stop("processor")
	p.write(d.ids["inbox"])
	p.until("stage 2 applied by the Stack group and stored in the inbox", func() bool {
		return p.applied(ctx, "stack", d.ids["inbox"]) == 200 &&
			p.count(ctx, `SELECT message_id FROM `+pgtx.QualifiedName(d.app, "inbox")+` WHERE consumer = 'inbox'`, d.ids["inbox"]) == 200
	})
	// A router stopped while an ack is on its way leaves that message unacked: a copy after the
	// restore, which the claims absorb but which is no effect of the restore. Stop them once both
	// groups have acked every row, so the redelivery counts below measure the restore alone.
	p.until("both groups acked every broker row", func() bool { return p.unacked(ctx) == 0 })
	p.stop("stack")
	p.stop("receiver")
	p.write(d.ids["broker"])
	p.until("stage 3 forwarded to the broker", func() bool { return p.inBroker(ctx, d.ids["broker"]) == 200 })
	p.stop("relay")
	p.write(d.ids["outbox"])
	p.close()

	d.file = filepath.Join(dir, fmt.Sprintf("v%d.dump", version))
	d.sourceXid = nextXid(ctx, t, db)
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	out, err := exec.CommandContext(ctx, "pg_dump", "-Fc", "-n", d.app, "-n", d.brokerSch, "-f", d.file, "--dbname", u.String()).CombinedOutput()
	require.NoError(t, err, "pg_dump: %s", out)
	return d
}

// runRestored restores d into a new database of the second cluster, runs the pipeline there,
// writes the new events and checks the outcome; lower says whether the cluster's counter is
// below the source's (then the checks must report the move and the rebase must repair it).
func runRestored(ctx context.Context, t *testing.T, admin *sql.DB, cli string, d *dumped, lower bool) {
	name := pgtest.NewName("restored")
	_, err := admin.ExecContext(ctx, `CREATE DATABASE `+pgtx.QuoteIdentifier(name))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.ExecContext(context.Background(), `DROP DATABASE IF EXISTS `+pgtx.QuoteIdentifier(name)+` WITH (FORCE)`)
	})
	u, err := url.Parse(restoreURL())
	require.NoError(t, err)
	u.Path = "/" + name
	out, err := exec.CommandContext(ctx, "pg_restore", "--exit-on-error", "--no-owner", "-d", u.String(), d.file).CombinedOutput()
	require.NoError(t, err, "pg_restore: %s", out)
	db, err := pgtx.Open(ctx, u.String(), pgtx.PoolConfig{MaxOpenConns: 24})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })

	p := newPipeline(ctx, t, db, d.app, d.brokerSch, d.version)
	p.startAll(ctx)
	p.write(d.ids["new-outbox"])
	for _, id := range d.ids["new-broker"] {
		require.NoError(t, p.pub.Publish(topic, message.NewMessage(id, []byte(`{}`))))
	}

	moved, err := sqlrebase.Check(ctx, db, d.brokerSch)
	require.NoError(t, err)
	if lower {
		require.ErrorIs(t, moved.Err(), broker.ErrSQLTopicsMoved, "the check reports the restored topic table")
		p.until("the SQL subscriptions log the move at ERROR", func() bool { return p.logs.HasError(broker.ErrSQLTopicsMoved) })
		require.ErrorIs(t, checkOutbox(ctx, t, db, d.app), outbox.ErrPositionsMoved, "the check reports the restored relay position")
		// Retention keeps every unforwarded row, whatever the positions say: it refuses while
		// they look moved, and deletes nothing unforwarded.
		_, err := outbox.Prune(ctx, db, d.app, pgtx.PruneRequest{Keep: time.Nanosecond})
		require.ErrorIs(t, err, outbox.ErrPositionsMoved, "a prune during the stall")
		require.Equal(t, 500, p.inOutbox(ctx, append(append([]string{}, d.ids["outbox"]...), d.ids["new-outbox"]...)),
			"a prune during the stall deleted unforwarded outbox rows")

		// The operator's checks, then the documented recovery: wmonce rebase, outbox and SQL
		// broker at once; then the checks are clean.
		doctor := wmonceFails(ctx, t, cli, u.String(), "-schema", d.app, "doctor", "-broker-schema", d.brokerSch)
		require.Contains(t, doctor, "RESTORED: schema "+d.app)
		require.Contains(t, doctor, "RESTORED: SQL broker schema "+d.brokerSch+", topic "+topic)
		dry := wmonce(ctx, t, cli, u.String(), "-schema", d.app, "rebase", "-dry-run", "-broker-schema", d.brokerSch)
		require.Contains(t, dry, "RESTORED", "the dry run reports the outbox position")
		require.Contains(t, dry, "topic "+topic+": 700 row(s) ahead", "the dry run reports the topic table's rows ahead")
		t.Logf("wmonce rebase:\n%s", wmonce(ctx, t, cli, u.String(), "-schema", d.app, "rebase", "-broker-schema", d.brokerSch))
		clean, err := sqlrebase.Check(ctx, db, d.brokerSch)
		require.NoError(t, err)
		require.NoError(t, clean.Err(), "the broker's tables after the rebase")
		require.NoError(t, checkOutbox(ctx, t, db, d.app), "the outbox positions after the rebase")
		doctor = wmonce(ctx, t, cli, u.String(), "-schema", d.app, "doctor", "-broker-schema", d.brokerSch)
		require.NotContains(t, doctor, "RESTORED")
	} else {
		require.NoError(t, moved.Err(), "a restore into a higher counter needs no rebase")
		require.NoError(t, checkOutbox(ctx, t, db, d.app), "a restore into a higher counter needs no rebase")
		require.NotContains(t, wmonce(ctx, t, cli, u.String(), "-schema", d.app, "doctor", "-broker-schema", d.brokerSch), "RESTORED")
	}

	all := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, d.ids[n]...)
		}
		return out
	}
	every := all("applied", "inbox", "broker", "outbox", "new-outbox", "new-broker")
	p.until("every event applied by both consumer kinds", func() bool {
		return p.applied(ctx, "stack", every) == len(every) && p.applied(ctx, "inbox", every) == len(every)
	})
	require.Equal(t, len(every), p.appliedRows(ctx, "stack", every), "an event applied twice by the Stack group")
	require.Equal(t, len(every), p.appliedRows(ctx, "inbox", every), "an event applied twice by the inbox group")

	// The table, as measured here.
	t.Logf("restore into a %s counter, watermill-sql v%d:", map[bool]string{true: "lower", false: "higher"}[lower], d.version)
	t.Logf("| events | where they were at the dump | applied after the restore (Stack / inbox) | most deliveries of one event after the restore (Stack / inbox) |")
	for _, s := range stages {
		ids := d.ids[s.name]
		t.Logf("| %d | %s | %d / %d | %d / %d |", s.events, s.name, p.applied(ctx, "stack", ids), p.applied(ctx, "inbox", ids),
			p.deliveries("stack", ids), p.deliveries("inbox", ids))
	}
	if !lower {
		// Nothing the source's groups had consumed is delivered again.
		require.Zero(t, p.deliveries("stack", all("applied", "inbox")), "the Stack group got an event it had consumed before the dump")
		require.Zero(t, p.deliveries("inbox", all("applied", "inbox")), "the inbox group got an event it had consumed before the dump")
		for _, n := range []string{"broker", "outbox", "new-outbox", "new-broker"} {
			require.Equal(t, 1, p.deliveries("stack", d.ids[n]), "stage %s delivered more than once to the Stack group", n)
			require.Equal(t, 1, p.deliveries("inbox", d.ids[n]), "stage %s delivered more than once to the inbox group", n)
		}
	}
}
