package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgcount"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// signalTracer signals when a statement whose SQL contains match has finished with the
// command tag tag ("" matches any tag).
type signalTracer struct {
	match, tag string
	ch         chan struct{}
}

type sqlKey struct{}

func newSignalTracer(match, tag string) *signalTracer {
	return &signalTracer{match: match, tag: tag, ch: make(chan struct{}, 1)}
}

func (s *signalTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (s *signalTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	q, _ := ctx.Value(sqlKey{}).(string)
	if strings.Contains(q, s.match) && (s.tag == "" || d.CommandTag.String() == s.tag) && d.Err == nil {
		select {
		case s.ch <- struct{}{}:
		default:
		}
	}
}

func (s *signalTracer) drain() {
	select {
	case <-s.ch:
	default:
	}
}

func (s *signalTracer) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case <-s.ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no %s within 30s", what)
	}
}

// multiTracer fans out to several tracers.
type multiTracer []pgx.QueryTracer

func (m multiTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	for _, t := range m {
		ctx = t.TraceQueryStart(ctx, c, d)
	}
	return ctx
}

func (m multiTracer) TraceQueryEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryEndData) {
	for _, t := range m {
		t.TraceQueryEnd(ctx, c, d)
	}
}

// wakeRig is a publishing Broker on the shared pool and a subscribing Broker on a pool of its
// own whose queries are counted and traced, both on one schema and topic.
type wakeRig struct {
	topic      string
	pub        message.Publisher
	sub        message.Subscriber
	counter    *pgcount.Counter
	emptySelct *signalTracer // the subscription's query found nothing
	xminCheck  *signalTracer // the subscription asked for the server's xmin
	listening  *signalTracer // the listener's LISTEN succeeded
}

// beforeSub, when set, runs once the publishing Broker has declared the topic and before the
// subscribing one does.
func newWakeRig(t *testing.T, version int, sqlCfg func(*broker.SQLConfig), beforeSub func(cfg broker.Config, topic string)) *wakeRig {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.Schema(t, pgtest.DB(t))
	r := &wakeRig{topic: pgtest.NewName("wake"), counter: &pgcount.Counter{}}
	r.emptySelct = newSignalTracer(`"watermill_`+r.topic+`"`, "SELECT 0")
	r.xminCheck = newSignalTracer("pg_snapshot_xmin(pg_current_snapshot())::text", "")
	r.listening = newSignalTracer("LISTEN ", "LISTEN")
	db, err := pgcount.Open(ctx, pgtest.URL(), 4, r.counter, multiTracer{r.emptySelct, r.xminCheck, r.listening})
	if err != nil {
		t.Fatalf("%v\nStart PostgreSQL or set DATABASE_URL.", err)
	}
	t.Cleanup(func() { _ = db.Close() })

	cfg := sqlConfig(t, schema, version)
	cfg.Subscriptions = []broker.Subscription{{Topic: r.topic, Group: "g"}}
	if sqlCfg != nil {
		sqlCfg(&cfg.SQL)
	}
	pb, err := broker.New(ctx, pgtest.DB(t), cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pb.Close() })
	r.pub, err = pb.NewPublisher(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.pub.Close() })
	if beforeSub != nil {
		beforeSub(cfg, r.topic)
	}
	sb, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sb.Close() })
	r.sub, err = sb.NewSubscriber("g")
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.sub.Close() })
	return r
}

// idle subscribes, delivers one message and returns once the subscription's next query has
// found nothing: from then on it waits, and only a wake-up (or its fallback poll) makes it
// query again.
func (r *wakeRig) idle(t *testing.T) <-chan *message.Message {
	t.Helper()
	ch, err := r.sub.Subscribe(context.Background(), r.topic)
	require.NoError(t, err)
	// A row committed before LISTEN took effect is found by the query LISTEN's success
	// triggers, unless an older transaction still hides it then; with both polls at an hour
	// the test would wait for ever, so it publishes only once the listener is up.
	r.listening.wait(t, "LISTEN on the subscribing pool")
	require.NoError(t, r.pub.Publish(r.topic, message.NewMessage("first", []byte("1"))))
	var m *message.Message
	select {
	case m = <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("first message not delivered within 30s")
	}
	r.emptySelct.drain()
	m.Ack()
	r.emptySelct.wait(t, "empty query after the first message")
	return ch
}

func receiveWithin(t *testing.T, ch <-chan *message.Message, uuid string, timeout time.Duration, why string) {
	t.Helper()
	select {
	case m, ok := <-ch:
		require.True(t, ok, "subscription closed")
		require.Equal(t, uuid, m.UUID)
		m.Ack()
	case <-time.After(timeout):
		t.Fatalf("message %s not delivered within %s: %s", uuid, timeout, why)
	}
}

// TestSQLSubscriberWokenByInsert: with both polls set to an hour, a message published while
// the subscription waits still arrives, so the insert itself woke it (NOTIFY from the topic
// table's trigger), not a poll.
func TestSQLSubscriberWokenByInsert(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSubscriberWokenByInsert)
}

func testSQLSubscriberWokenByInsert(t *testing.T, version int) {
	r := newWakeRig(t, version, func(c *broker.SQLConfig) { c.PollInterval, c.IdlePollInterval = time.Hour, time.Hour }, nil)
	ch := r.idle(t)
	require.NoError(t, r.pub.Publish(r.topic, message.NewMessage("second", []byte("2"))))
	receiveWithin(t, ch, "second", 30*time.Second, "the insert did not wake the subscription")
}

// TestSQLSubscriberWokenWhenHiddenRowTurnsVisible: a notified row can be hidden from
// watermill-sql's query by an older transaction that is still open (rows are shown only below
// the server's snapshot xmin). When that transaction ends, nothing notifies; the subscription
// must notice by itself, although both polls are an hour.
func TestSQLSubscriberWokenWhenHiddenRowTurnsVisible(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSubscriberWokenWhenHiddenRowTurnsVisible)
}

func testSQLSubscriberWokenWhenHiddenRowTurnsVisible(t *testing.T, version int) {
	r := newWakeRig(t, version, func(c *broker.SQLConfig) { c.PollInterval, c.IdlePollInterval = time.Hour, time.Hour }, nil)
	ch := r.idle(t)

	ctx := context.Background()
	older, err := pgtest.DB(t).BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = older.Rollback() }()
	var xid string
	require.NoError(t, older.QueryRowContext(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid)) // takes an xid

	r.xminCheck.drain()
	require.NoError(t, r.pub.Publish(r.topic, message.NewMessage("hidden", []byte("2"))))
	r.xminCheck.wait(t, "xmin check after the notification")
	select {
	case m := <-ch:
		t.Fatalf("message %s delivered while an older transaction was open: the row should be hidden", m.UUID)
	default:
	}
	require.NoError(t, older.Commit())
	receiveWithin(t, ch, "hidden", 60*time.Second,
		"the row turned visible (older transaction committed) but the subscription did not query again; a long transaction elsewhere on the server also delays it")
}

// TestSQLSubscriberIdleQueryRate counts, at the wire, every query of the subscribing pool
// (BEGIN, SELECT, COMMIT, pgx's liveness pings, the listener's LISTEN) while the subscription
// has nothing to read, with the default IdlePollInterval and the tests' 20 ms PollInterval:
// at most 2 per second. The window is a measurement, not a wait for an event: a slower
// machine only lowers the count.
func TestSQLSubscriberIdleQueryRate(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSubscriberIdleQueryRate)
}

func testSQLSubscriberIdleQueryRate(t *testing.T, version int) {
	r := newWakeRig(t, version, nil, nil)
	_ = r.idle(t)
	const window = 9 * time.Second
	before := r.counter.Count()
	time.Sleep(window)
	got := r.counter.Count() - before
	perSec := float64(got) / window.Seconds()
	t.Logf("idle subscription: %d queries in %s (%.2f/s)", got, window, perSec)
	require.LessOrEqual(t, perSec, 2.0, "idle SQL-broker subscription issued %d queries in %s", got, window)
}

// TestSQLSubscriberWokenThroughATriggerOfAnEarlierVersion: a topic table whose trigger
// notifies the channel name an earlier version used (the schema's hash) gets its trigger
// replaced when a Broker declares the topic, so that the insert still wakes a subscription
// whose polls are an hour away.
func TestSQLSubscriberWokenThroughATriggerOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSubscriberWokenThroughATriggerOfAnEarlierVersion)
}

func testSQLSubscriberWokenThroughATriggerOfAnEarlierVersion(t *testing.T, version int) {
	var table string
	r := newWakeRig(t, version, func(c *broker.SQLConfig) { c.PollInterval, c.IdlePollInterval = time.Hour, time.Hour },
		func(cfg broker.Config, topic string) {
			table = pgtx.QualifiedName(cfg.SQL.Schema, "watermill_"+topic)
			pgtest.Exec(t, pgtest.DB(t), `DROP TRIGGER wmonce_notify ON `+table)
			pgtest.Exec(t, pgtest.DB(t), `CREATE TRIGGER wmonce_notify AFTER INSERT ON `+table+` FOR EACH STATEMENT EXECUTE FUNCTION `+
				pgtx.QualifiedName(cfg.SQL.Schema, "wmonce_notify_insert")+`('wmonce_broker_0123456789abcdef')`)
		})
	require.Equal(t, 1, pgtest.Count(t, pgtest.DB(t), `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = 'wmonce_notify'`, table),
		"the trigger is replaced, not doubled")
	ch := r.idle(t)
	require.NoError(t, r.pub.Publish(r.topic, message.NewMessage("second", []byte("2"))))
	receiveWithin(t, ch, "second", 30*time.Second, "the insert did not wake the subscription: the trigger still notifies another channel")
}
