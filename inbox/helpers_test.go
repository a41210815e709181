package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// env is one test's schema, with an effects table the handlers write to in their transaction.
type env struct {
	db     *sql.DB
	schema string
	ops    *inbox.Ops
	batch  bool // the processors' handlers run as batch handlers (asBatch)
}

// handlers makes the env's processors run their handlers as batch handlers when batch is set.
func (e *env) handlers(batch bool) *env {
	e.batch = batch
	return e
}

// asBatch is a batch handler applying its messages through h one by one, in the batch's
// transaction (each message's context carries it): the same writes, outputs and errors, a
// failed message named in a *once.BatchError (a serialization failure or deadlock fails the
// batch as a whole, as its statement would).
func asBatch(h message.HandlerFunc) message.HandlerFunc {
	return once.BatchHandler(func(_ context.Context, _ *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		var all []*message.Message
		for _, m := range msgs {
			out, err := h(m)
			if pgtx.IsRetryableTx(err) {
				return nil, err
			}
			if err != nil {
				return nil, &once.BatchError{Failed: map[*message.Message]error{m: err}}
			}
			all = append(all, out...)
		}
		return all, nil
	})
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvOn(t, pgtest.DB(t))
}

func newEnvOn(t testing.TB, db *sql.DB) *env {
	t.Helper()
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "effects")+` (
    id bigserial PRIMARY KEY, message_id text NOT NULL, okey text NOT NULL DEFAULT '',
    seq int NOT NULL DEFAULT 0, worker text NOT NULL DEFAULT '')`)
	ops, err := inbox.NewOps(db, inbox.OpsConfig{Schema: schema}, nil)
	require.NoError(t, err)
	return &env{db: db, schema: schema, ops: ops}
}

func (e *env) table(name string) string { return pgtx.QualifiedName(e.schema, name) }

func logger() watermill.LoggerAdapter {
	if testing.Verbose() {
		return watermill.NewStdLogger(false, false)
	}
	return watermill.NopLogger{}
}

func (e *env) receiver(t testing.TB, cfg inbox.ReceiverConfig) *inbox.Receiver {
	t.Helper()
	cfg.Schema = e.schema
	r, err := inbox.NewReceiver(e.db, cfg, logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// receiverSignals initialises r's test signals and returns them. Call it before r's first
// Handle.
func receiverSignals(r *inbox.Receiver) *inbox.ReceiverTestSignals {
	sig := r.TestSignals()
	sig.Queued.Init()
	sig.BatchTaken.Init()
	sig.BatchCommitted.Init()
	sig.Refused.Init()
	return sig
}

// processor returns a processor of the test's schema, not running yet.
func (e *env) processor(t testing.TB, h message.HandlerFunc, cfg inbox.ProcessorConfig) *inbox.Processor {
	t.Helper()
	cfg.Schema = e.schema
	if e.batch {
		h = asBatch(h)
	}
	p, err := inbox.NewProcessor(e.db, h, cfg, logger())
	require.NoError(t, err)
	return p
}

// run runs p until the test ends (or the test closes it first).
func (e *env) run(t testing.TB, p *inbox.Processor) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = p.Close()
		require.NoError(t, <-done)
	})
}

// start runs a processor until the test ends (or the test closes it first), with its test
// signals on.
func (e *env) start(t testing.TB, h message.HandlerFunc, cfg inbox.ProcessorConfig) *proc {
	t.Helper()
	p := e.processor(t, h, cfg)
	sig := p.TestSignals()
	sig.Claimed.Init()
	sig.Settled.Init()
	sig.LeasesRenewed.Init()
	sig.LeaseExpired.Init()
	sig.ClaimFailed.Init()
	e.run(t, p)
	return &proc{Processor: p, sig: sig}
}

// proc is a processor a test runs, with its test signals and the rows it has settled as far
// as the test has read them (see until).
type proc struct {
	*inbox.Processor
	sig     *inbox.ProcessorTestSignals
	settled tally
}

// tally counts settled rows by what became of them: one field per inbox.SettledAs, each the
// number of rows that went to that counter of inbox.ProcessorCounters.
type tally struct{ Done, Failed, Parked, Released, LeaseLost int }

func (n *tally) add(as inbox.SettledAs) {
	switch as {
	case inbox.SettledDone:
		n.Done++
	case inbox.SettledFailed:
		n.Failed++
	case inbox.SettledParked:
		n.Parked++
	case inbox.SettledReleased:
		n.Released++
	case inbox.SettledLeaseLost:
		n.LeaseLost++
	default:
		panic(fmt.Sprintf("unknown SettledAs %q", as))
	}
}

// until waits until cond holds for the rows p has settled so far: it reads p's Settled
// signal, checking cond first and after each row.
func (p *proc) until(t testing.TB, what string, cond func(settled tally) bool) {
	t.Helper()
	untilSettled(t, what, func() bool { return cond(p.settled) }, p)
}

// untilSettled checks cond, and again after each row any of ps settles, until it holds. It
// fails the test, saying what it waited for, when no row settles for testsignal.Timeout.
func untilSettled(t testing.TB, what string, cond func() bool, ps ...*proc) {
	t.Helper()
	cases := make([]reflect.SelectCase, len(ps)+1)
	for i, p := range ps {
		cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.sig.Settled.C())}
	}
	for !cond() {
		cases[len(ps)] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(testsignal.Timeout))}
		i, v, _ := reflect.Select(cases)
		if i == len(ps) {
			tallies := make([]tally, len(ps))
			for j, p := range ps {
				tallies[j] = p.settled
			}
			t.Fatalf("no row settled for %s while waiting for %s; settled so far: %+v", testsignal.Timeout, what, tallies)
		}
		ps[i].settled.add(v.Interface().(inbox.SettledRow).As)
	}
}

// effect records one effect of msg in its transaction.
func (e *env) effect(msg *message.Message, worker string) error {
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return errors.New("no transaction in the message context")
	}
	d, ok := inbox.DeliveryFromContext(msg.Context())
	if !ok {
		return errors.New("no delivery in the message context")
	}
	var seq int
	_, _ = fmt.Sscan(msg.Metadata.Get("seq"), &seq)
	_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (message_id, okey, seq, worker) VALUES ($1, $2, $3, $4)`,
		d.MessageID, d.OrderingKey, seq, worker)
	return err
}

func (e *env) effects(t testing.TB) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects"))
}

func (e *env) status(t testing.TB, consumer string, s inbox.Status) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE consumer = $1 AND status = $2`, consumer, string(s))
}

// msg builds a message with the given UUID and metadata pairs.
func msg(uuid, payload string, kv ...string) *message.Message {
	m := message.NewMessage(uuid, []byte(payload))
	for i := 0; i+1 < len(kv); i += 2 {
		m.Metadata.Set(kv[i], kv[i+1])
	}
	return m
}

// orderByMetadataKey orders by the "key" metadata field when present; messages without it
// are unordered.
func orderByMetadataKey(m *message.Message) (string, error) { return m.Metadata.Get("key"), nil }

// fast is a processor configuration for tests: short backoff, quick reaping.
func fast(consumer string) inbox.ProcessorConfig {
	return inbox.ProcessorConfig{
		Consumer:      consumer,
		Backoff:       5 * time.Millisecond,
		MaxBackoff:    50 * time.Millisecond,
		ReapInterval:  50 * time.Millisecond,
		PollInterval:  200 * time.Millisecond,
		ShutdownGrace: 2 * time.Second,
	}
}

// storeAll stores msgs in one transaction.
func storeAll(t *testing.T, e *env, r *inbox.Receiver, msgs []*message.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = r.StoreTx(ctx, tx, "t", msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
}
