package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// env is one test's schema, with an effects table the handlers write to in their transaction.
type env struct {
	db     *sql.DB
	schema string
	ops    *inbox.Ops
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

// start runs a processor until the test ends (or the test closes it first).
func (e *env) start(t testing.TB, h message.HandlerFunc, cfg inbox.ProcessorConfig) *inbox.Processor {
	t.Helper()
	cfg.Schema = e.schema
	p, err := inbox.NewProcessor(e.db, h, cfg, logger())
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = p.Close()
		require.NoError(t, <-done)
	})
	return p
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
