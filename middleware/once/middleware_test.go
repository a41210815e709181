package once_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// env is one test's schema with a business table the handlers write to.
type env struct {
	db     *sql.DB
	schema string
	mw     *once.Middleware
}

func newEnv(t *testing.T, cfg once.Config) *env {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	pgtest.Exec(t, db, `CREATE TABLE `+pgtx.QualifiedName(schema, "effects")+` (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL)`)
	cfg.Schema = schema
	mw, err := once.New(db, cfg, watermill.NewStdLogger(false, false))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mw.Close() })
	return &env{db: db, schema: schema, mw: mw}
}

func (e *env) table(name string) string { return pgtx.QualifiedName(e.schema, name) }

// effect is a handler that records one effect row in the message's transaction.
func (e *env) effect(msg *message.Message) ([]*message.Message, error) {
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return nil, errors.New("no tx in context")
	}
	_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+e.table("effects")+` (key, amount) VALUES ($1, 1)`, msg.UUID)
	return nil, err
}

func (e *env) effects(t *testing.T) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("effects"))
}

func (e *env) claims(t *testing.T) int {
	return pgtest.Count(t, e.db, `SELECT count(*) FROM `+e.table("processed_messages"))
}

// deliver hands one copy of a message to the wrapped handler, as a subscriber would, and
// returns what the router would see: nil means ack.
func deliver(h message.HandlerFunc, uuid string, payload string) error {
	_, err := h(message.NewMessage(uuid, []byte(payload)))
	return err
}

func TestInvalidConfigFailsAtConstruction(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for name, cfg := range map[string]once.Config{
		"bad schema":       {Schema: `public"; DROP TABLE x; --`},
		"blank consumer":   {Consumer: "   "},
		"key too long":     {MaxKeyLength: 5000},
		"bad output":       {OutputTopic: "has space"},
		"negative retries": {TxRetry: pgtx.RetryPolicy{MaxAttempts: -1}},
	} {
		_, err := once.New(db, cfg, nil)
		require.Error(t, err, name)
		require.ErrorContains(t, err, "invalid config", name)
	}
	// A consumer PostgreSQL cannot store fails here, by the rule every component applies (the
	// inbox Receiver refuses the same name), not at the first message's claim.
	for consumer, want := range map[string]string{
		"pay\x00ments": "Consumer must not contain NUL bytes",
		"pay\xffments": "Consumer must be valid UTF-8",
	} {
		_, err := once.New(db, once.Config{Consumer: consumer}, nil)
		require.ErrorContains(t, err, "invalid config")
		require.ErrorContains(t, err, want)
	}
	_, err := once.New(nil, once.Config{}, nil)
	require.ErrorContains(t, err, "db is nil")

	// An unreachable database fails when it is opened, not at the first message.
	_, err = pgtx.Open(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", pgtx.PoolConfig{PingTimeout: 3 * time.Second})
	require.ErrorContains(t, err, "cannot reach PostgreSQL")
}

func TestMissingMigrationsSaySo(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	mw, err := once.New(db, once.Config{Schema: pgtest.NewName("nothing"), Consumer: "c"}, nil)
	require.NoError(t, err)
	_, err = mw.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("a", nil))
	require.ErrorContains(t, err, "run the migrations")
}

// capture is a publisher that remembers what it was given: the relay's target in unit tests.
type capture struct {
	mu   sync.Mutex
	msgs []captured
	// published receives each message as it is published, for a test to wait on.
	published chan captured
}

type captured struct {
	topic string
	msg   *message.Message
}

func newCapture() *capture { return &capture{published: make(chan captured, 1000)} }

func (c *capture) Publish(topic string, msgs ...*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		c.msgs = append(c.msgs, captured{topic, m})
		select {
		case c.published <- captured{topic, m}:
		default: // nobody waits for that many
		}
	}
	return nil
}

func (c *capture) Close() error { return nil }

func (c *capture) all() []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]captured(nil), c.msgs...)
}

// Services sharing a schema stamp their outbox rows with their Source; the middleware's default
// Writer does so with OutboxSource, so its outputs reach the service's own relay.
func TestOutboxSourceStampsTheOutputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, once.Config{Consumer: "c", OutputTopic: "out", OutboxSource: "billing"})
	h := e.mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte(`{}`))}, nil
	})
	require.NoError(t, deliver(h, "e-1", "p"))
	var source string
	require.NoError(t, e.db.QueryRow(`SELECT source FROM `+e.table("outbox")).Scan(&source))
	require.Equal(t, "billing", source)

	w, err := outbox.NewWriter(outbox.Config{Schema: e.schema, Source: "billing"})
	require.NoError(t, err)
	_, err = once.New(e.db, once.Config{Schema: e.schema, Outbox: w, OutboxSource: "billing"}, nil)
	require.ErrorContains(t, err, "set OutboxSource or Outbox, not both")
}

// TxOptions that fail every transaction (issue 34, item 3) are refused at construction with the
// field named, not at each message (25006 or "unsupported isolation", nacked forever).
func TestTxOptionsThatCannotWorkAreRefusedAtConstruction(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	for want, opts := range map[string]*sql.TxOptions{
		"TxOptions.ReadOnly must be false": {ReadOnly: true},
		"TxOptions.Isolation must be":      {Isolation: sql.LevelLinearizable},
		"PostgreSQL has no SNAPSHOT":       {Isolation: sql.LevelSnapshot},
	} {
		_, err := once.New(db, once.Config{Consumer: "c", TxOptions: opts}, nil)
		require.ErrorContains(t, err, "once: invalid config")
		require.ErrorContains(t, err, want)
	}
	_, err := once.New(db, once.Config{Consumer: "c", TxOptions: &sql.TxOptions{Isolation: sql.LevelSerializable}}, nil)
	require.NoError(t, err)
}
