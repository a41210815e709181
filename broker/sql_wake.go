package broker

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/pgnotify"
	"github.com/wmonce/watermill-once/pgtx"
)

// Wake-ups for the SQL broker's subscribers.
//
// watermill-sql's subscriber polls: after a query that found nothing it waits PollInterval
// and queries again (BEGIN, SELECT, COMMIT), however long the topic stays empty. Here every
// topic table has a statement-level AFTER INSERT trigger that calls pg_notify on one channel
// per broker schema with "<table> <inserting transaction id>"; the first subscription of a
// Broker starts one listener connection of its own (not a pool connection) that LISTENs on it,
// and each subscription waits for its table's notification, or IdlePollInterval as a fallback.
//
// A notified row is not readable at once in every case: watermill-sql shows a row only when
// its transaction is older than every transaction still running on the server
// (transaction_id < pg_snapshot_xmin). So a subscription remembers the transaction ids it was
// notified of and, when its query found nothing, asks the server for the current xmin until
// one of them is below it, backing off from 5 ms up to PollInterval (at most 1 s); then it
// queries again.
// An unrelated open transaction therefore delays a notified row exactly as it delays a polled
// one, and no longer than that.

const (
	notifyFunction = "wmonce_notify_insert"
	notifyTrigger  = "wmonce_notify"
	// maxPendingXids bounds the transaction ids a subscription remembers; beyond it only the
	// largest is kept, which covers the others conservatively (it is the last to turn visible).
	maxPendingXids = 1024
)

// NotifyChannel returns the PostgreSQL channel on which the SQL broker's topic tables in this
// schema announce inserts ("<table> <xid8>" payloads): "wmonce_broker_" + schema, or a hash of
// the schema in its place when that is longer than PostgreSQL's 63-byte limit.
func (c SQLConfig) NotifyChannel() string { return pgnotify.Channel("wmonce_broker_", c.Schema) }

// notifyFunctionQuery creates the schema's trigger function (run at New); ensureNotifyTrigger
// adds a topic table's trigger at Declare, only when it is missing or notifies another channel
// (an earlier version's name): CREATE TRIGGER locks out inserts for a moment.
func (s *sqlBroker) notifyFunctionQuery() string {
	return `CREATE OR REPLACE FUNCTION ` + pgtx.QualifiedName(s.config.Schema, notifyFunction) + `() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify(TG_ARGV[0], TG_TABLE_NAME || ' ' || pg_current_xact_id()::text);
	RETURN NULL;
END
$$`
}

func (s *sqlBroker) ensureNotifyTrigger(ctx context.Context, tx *sql.Tx, topic string) error {
	channel := s.config.NotifyChannel()
	// current: the trigger exists and notifies channel (its one argument, NUL-terminated in
	// tgargs). A trigger of an earlier version notifies another channel name: replace it.
	var exists, current bool
	err := tx.QueryRowContext(ctx, `SELECT count(*) > 0, coalesce(bool_or(tgargs = convert_to($3, 'UTF8') || '\x00'::bytea), false)
FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2`,
		s.MessagesTable(topic), notifyTrigger, channel).Scan(&exists, &current)
	if err != nil || current {
		return err
	}
	trigger := pgtx.QuoteIdentifier(notifyTrigger)
	if exists {
		if _, err := tx.ExecContext(ctx, `DROP TRIGGER `+trigger+` ON `+s.MessagesTable(topic)); err != nil {
			return err
		}
	}
	// A trigger's arguments are literals, not parameters.
	_, err = tx.ExecContext(ctx, `CREATE TRIGGER `+trigger+` AFTER INSERT ON `+s.MessagesTable(topic)+
		` FOR EACH STATEMENT EXECUTE FUNCTION `+pgtx.QualifiedName(s.config.Schema, notifyFunction)+`(`+quoteLiteral(channel)+`)`)
	return err
}

// quoteLiteral quotes s as a standard SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// sqlNotifier runs one LISTEN connection for a Broker while it has subscriptions, and hands
// each notification to the subscriptions of the table it names.
type sqlNotifier struct {
	db      *sql.DB
	channel string
	logger  watermill.LoggerAdapter

	mu      sync.Mutex
	waiters map[string]map[*sqlWaiter]struct{} // unquoted table name -> subscriptions
	refs    int
	run     *listenRun
	// disabled is set when the pool's driver is not pgx: no LISTEN connection can be made.
	disabled atomic.Bool
}

// listenRun is one life of the listener goroutine, from the first subscription to the last.
type listenRun struct {
	cancel    context.CancelFunc
	done      chan struct{}
	listening atomic.Bool
}

func newSQLNotifier(db *sql.DB, channel string, logger watermill.LoggerAdapter) *sqlNotifier {
	return &sqlNotifier{db: db, channel: channel, logger: logger, waiters: map[string]map[*sqlWaiter]struct{}{}}
}

// listening reports whether notifications are being received right now.
func (n *sqlNotifier) listening() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.run != nil && n.run.listening.Load()
}

func (n *sqlNotifier) register(w *sqlWaiter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	set := n.waiters[w.table]
	if set == nil {
		set = map[*sqlWaiter]struct{}{}
		n.waiters[w.table] = set
	}
	set[w] = struct{}{}
	n.refs++
	if n.run == nil {
		ctx, cancel := context.WithCancel(context.Background())
		r := &listenRun{cancel: cancel, done: make(chan struct{})}
		n.run = r
		go n.listen(ctx, r)
	}
}

// unregister removes w; the last subscription stops the listener and waits for it.
func (n *sqlNotifier) unregister(w *sqlWaiter) {
	n.mu.Lock()
	if set := n.waiters[w.table]; set != nil {
		delete(set, w)
		if len(set) == 0 {
			delete(n.waiters, w.table)
		}
	}
	n.refs--
	var stop *listenRun
	if n.refs == 0 {
		stop, n.run = n.run, nil
	}
	n.mu.Unlock()
	if stop != nil {
		stop.cancel()
		<-stop.done
	}
}

// listen runs the listener (internal/pgnotify, on a connection of its own: not one of the
// pool's) until ctx ends, or for good when the pool's driver cannot LISTEN.
func (n *sqlNotifier) listen(ctx context.Context, r *listenRun) {
	defer close(r.done)
	if n.disabled.Load() {
		return
	}
	err := pgnotify.Listener{
		DB:            n.db,
		Channels:      map[string]func(string){n.channel: n.dispatch},
		OwnConnection: true,
		OnListen: func() {
			r.listening.Store(true)
			// Rows committed before LISTEN took effect sent their notification to nobody:
			// every subscription queries again. One still hidden then by an older
			// transaction is found by the IdlePollInterval fallback.
			n.wakeAll()
		},
		OnLost: func(err error, backoff time.Duration) {
			r.listening.Store(false)
			n.logger.Error("SQL broker LISTEN connection lost, polling every PollInterval until it is back", err, watermill.LogFields{"backoff": backoff})
		},
	}.Run(ctx)
	r.listening.Store(false)
	if errors.Is(err, pgnotify.ErrNotPgx) {
		n.disabled.Store(true)
		n.logger.Error("SQL broker wake-ups disabled: subscribers poll every PollInterval", err, nil)
	}
}

func (n *sqlNotifier) dispatch(payload string) {
	table, xidText, ok := strings.Cut(payload, " ")
	xid, err := strconv.ParseUint(xidText, 10, 64)
	n.mu.Lock()
	defer n.mu.Unlock()
	for w := range n.waiters[table] {
		if ok && err == nil {
			w.notified(xid)
		} else {
			w.requeryNow()
		}
	}
}

func (n *sqlNotifier) wakeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, set := range n.waiters {
		for w := range set {
			w.requeryNow()
		}
	}
}

// snapshotXmin returns the oldest transaction still running on the server: rows of older
// transactions are what watermill-sql's query can see.
func (n *sqlNotifier) snapshotXmin(ctx context.Context) (uint64, error) {
	var text string
	if err := n.db.QueryRowContext(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`).Scan(&text); err != nil {
		return 0, err
	}
	return strconv.ParseUint(text, 10, 64)
}

// sqlWaiter is the BackoffManager of one subscription: watermill-sql calls HandleError after
// every query, and this one blocks after an empty query until the subscription should query
// again (watermill-sql's own wait is then zero).
type sqlWaiter struct {
	n        *sqlNotifier
	table    string
	ctx      context.Context
	closing  <-chan struct{}
	poll     time.Duration // fast interval: listener down, or re-check backoff cap
	idlePoll time.Duration // fallback while notifications are received
	errors   sqlBackoff

	wake chan struct{} // capacity 1: a notification that arrives during a query is kept

	mu      sync.Mutex
	pending []uint64 // notified transaction ids not yet seen below the server's xmin
	over    uint64   // largest id dropped because pending was full
	requery bool     // query again at once (listener (re)connected, unparsable payload)
}

func (w *sqlWaiter) notified(xid uint64) {
	w.mu.Lock()
	if len(w.pending) < maxPendingXids {
		w.pending = append(w.pending, xid)
	} else {
		w.over = max(w.over, xid)
	}
	w.mu.Unlock()
	w.signal()
}

func (w *sqlWaiter) requeryNow() {
	w.mu.Lock()
	w.requery = true
	w.mu.Unlock()
	w.signal()
}

func (w *sqlWaiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// state returns whether to query at once and whether notified rows are still hidden.
func (w *sqlWaiter) state() (requery, pending bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	requery, w.requery = w.requery, false
	return requery, len(w.pending) > 0 || w.over != 0
}

// dropVisible forgets the notified ids below xmin and reports whether there were any.
func (w *sqlWaiter) dropVisible(xmin uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	kept := w.pending[:0]
	for _, x := range w.pending {
		if x >= xmin {
			kept = append(kept, x)
		}
	}
	visible := len(kept) < len(w.pending)
	w.pending = kept
	if w.over != 0 && w.over < xmin {
		w.over, visible = 0, true
	}
	return visible
}

func (w *sqlWaiter) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	if err != nil || !noMsg {
		return w.errors.HandleError(logger, noMsg, err)
	}
	w.wait()
	return 0
}

// wait returns when the subscription should query again.
func (w *sqlWaiter) wait() {
	backoff := 5 * time.Millisecond
	for {
		requery, pending := w.state()
		if requery {
			return
		}
		if pending && w.pendingVisible() {
			return
		}
		d := w.idleDelay()
		if pending { // re-check, backing off, while the notified row stays hidden
			d, backoff = backoff, min(backoff*2, w.poll, time.Second)
		}
		if w.sleep(d, pending) {
			return
		}
	}
}

// pendingVisible says whether a notified row that an older open transaction hid is visible now
// (and drops it from the pending ones).
func (w *sqlWaiter) pendingVisible() bool {
	xmin, err := w.n.snapshotXmin(w.ctx)
	return err == nil && w.dropVisible(xmin)
}

// idleDelay is the wait after an empty read: IdlePollInterval while wake-ups work, else
// PollInterval.
func (w *sqlWaiter) idleDelay() time.Duration {
	if w.n.listening() {
		return w.idlePoll
	}
	return w.poll
}

// sleep waits d or for a wake-up, and says whether the subscription should query now: at the
// end of an idle wait (not one that re-checks a pending row), or when the subscription ends. A
// wake-up says no: wait looks at the state again.
func (w *sqlWaiter) sleep(d time.Duration, pending bool) (requery bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.wake:
		return false
	case <-t.C:
		return !pending
	case <-w.closing:
	case <-w.ctx.Done():
	}
	return true
}

// sqlSubscriber is watermill-sql's subscriber with wake-ups: one watermill-sql Subscriber per
// Subscribe call, so each subscription has a BackoffManager (sqlWaiter) of its own, and a new
// transaction when its one can no longer commit (sql_restart.go).
type sqlSubscriber struct {
	s      *sqlBroker
	group  string
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	subs    []message.Subscriber // watermill-sql's, one per Subscribe
	waiters []*sqlWaiter
}

func (s *sqlBroker) newSubscriber(group string, logger watermill.LoggerAdapter) (*sqlSubscriber, error) {
	logger = quietCancel{logger}
	sub := &sqlSubscriber{s: s, group: group, logger: logger, closing: make(chan struct{})}
	// Fail at construction on a config watermill-sql refuses, not at Subscribe.
	if _, err := s.wm.newSubscriber(group, nil, logger); err != nil {
		return nil, err
	}
	return sub, nil
}

func (s *sqlSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.s.wm.errSubscriberClosed()
	}
	cfg := s.s.config
	backoff := defaultSQLBackoff(cfg.PollInterval)
	var w *sqlWaiter
	if !cfg.DisableListen && !s.s.notifier.disabled.Load() {
		w = &sqlWaiter{
			n: s.s.notifier, table: "watermill_" + topic, ctx: ctx, closing: s.closing,
			poll: cfg.PollInterval, idlePoll: cfg.IdlePollInterval,
			errors: backoff,
			wake:   make(chan struct{}, 1),
		}
		backoff = w
	}
	backoff = &moveWatch{next: backoff, s: s.s, topic: topic, group: s.group, ctx: ctx, signal: s.s.moveDetected.Signal}
	sub, err := s.s.wm.newSubscriber(s.group, backoff, s.logger)
	if err != nil {
		return nil, err
	}
	if w != nil {
		s.s.notifier.register(w)
	}
	run, err := s.startRunLocked(ctx, sub, topic)
	if err != nil {
		if w != nil {
			s.s.notifier.unregister(w)
		}
		return nil, err
	}
	s.subs = append(s.subs, sub)
	if w != nil {
		s.waiters = append(s.waiters, w)
	}
	out := make(chan *message.Message)
	go s.forward(ctx, sub, topic, w, run, out)
	return out, nil
}

// Close stops every subscription (a waiting one is woken first) and returns when their
// consume loops have stopped.
func (s *sqlSubscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	subs, waiters := s.subs, s.waiters
	s.mu.Unlock()
	var errs []error
	for _, sub := range subs {
		errs = append(errs, sub.Close())
	}
	for _, w := range waiters {
		s.s.notifier.unregister(w)
	}
	return errors.Join(errs...)
}

// quietCancel logs at Debug what watermill-sql reports as errors when a subscription ends
// (Close, or its Subscribe context): the query cancelled with it ("Error querying for message:
// ... context canceled") and the rollback of that query's transaction, whose connection pgx
// closed on the cancellation ("could not rollback tx", query_err: context canceled). Ending a
// subscription is not an error, and an operator who sees ERROR lines at every clean shutdown
// learns to ignore them. Every other error stays an error.
type quietCancel struct{ watermill.LoggerAdapter }

func (l quietCancel) Error(msg string, err error, fields watermill.LogFields) {
	queryErr, _ := fields["query_err"].(error)
	if errors.Is(err, context.Canceled) || errors.Is(queryErr, context.Canceled) {
		l.Debug(msg, fields.Add(watermill.LogFields{"err": err}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l quietCancel) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return quietCancel{l.LoggerAdapter.With(fields)}
}
