package oncetest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/oncetest"
	"github.com/wmonce/watermill-once/pgtx"
)

// bank is the handlers' world: deposits to accounts, a ledger row per deposit, and an output
// message per deposit.
type bank struct {
	db       *sql.DB
	schema   string
	accounts string
	ledger   string
}

func newBank(t *testing.T) *bank {
	t.Helper()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	b := &bank{db: db, schema: schema, accounts: pgtx.QualifiedName(schema, "accounts"), ledger: pgtx.QualifiedName(schema, "ledger")}
	pgtest.Exec(t, db, `CREATE TABLE `+b.accounts+` (id text PRIMARY KEY, balance bigint NOT NULL)`)
	pgtest.Exec(t, db, `CREATE TABLE `+b.ledger+` (event text NOT NULL, account text NOT NULL, amount bigint NOT NULL)`)
	return b
}

// events: three deposits to account a and one to b, in the producer's order.
func (b *bank) events() []*message.Message {
	var out []*message.Message
	for i, d := range []struct {
		account string
		amount  int
	}{{"a", 1}, {"a", 2}, {"b", 8}, {"a", 4}} {
		m := message.NewMessage(fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i+1), []byte(strconv.Itoa(d.amount)))
		m.Metadata.Set("account", d.account)
		out = append(out, m)
	}
	return out
}

func (b *bank) reset(ctx context.Context, db *sql.DB) error {
	_, err := db.ExecContext(ctx, `TRUNCATE `+b.accounts+`, `+b.ledger+`;
		INSERT INTO `+b.accounts+` VALUES ('a', 0), ('b', 0)`)
	return err
}

// effect is a snapshot: each account's balance and the ledger's row count.
func (b *bank) effect(ctx context.Context, db *sql.DB) (any, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, balance, (SELECT count(*) FROM `+b.ledger+` l WHERE l.account = a.id) FROM `+b.accounts+` a ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	var snap []string
	for rows.Next() {
		var id string
		var balance, entries int64
		if err := rows.Scan(&id, &balance, &entries); err != nil {
			return nil, err
		}
		snap = append(snap, fmt.Sprintf("%s: balance %d, %d ledger rows", id, balance, entries))
	}
	return snap, rows.Err()
}

func (b *bank) kit(t *testing.T, cfg oncetest.Config) *oncetest.Kit {
	cfg.DB, cfg.Schema = b.db, b.schema
	if cfg.Events == nil {
		cfg.Events = b.events
	}
	if cfg.Reset == nil {
		cfg.Reset = b.reset
	}
	if cfg.Effect == nil {
		cfg.Effect = b.effect
	}
	return oncetest.New(t, cfg)
}

func deposit(msg *message.Message) (account string, amount int, err error) {
	amount, err = strconv.Atoi(string(msg.Payload))
	return msg.Metadata.Get("account"), amount, err
}

// correct writes everything through the lent transaction and returns its output.
func (b *bank) correct(msg *message.Message) ([]*message.Message, error) {
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return nil, errors.New("no transaction in the message context")
	}
	account, amount, err := deposit(msg)
	if err != nil {
		return nil, err
	}
	ctx := msg.Context()
	if _, err := tx.ExecContext(ctx, `UPDATE `+b.accounts+` SET balance = balance + $2 WHERE id = $1`, account, amount); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+b.ledger+` VALUES ($1, $2, $3)`, msg.UUID, account, amount); err != nil {
		return nil, err
	}
	return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"deposited":`+string(msg.Payload)+`}`))}, nil
}

// recorder is a testing.TB that keeps the kit's violations instead of failing the test.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// expectCaught runs h through the kit and requires a violation whose text contains want; it
// logs every message, as a user would read them.
func expectCaught(t *testing.T, kit *oncetest.Kit, h message.HandlerFunc, want string) []oncetest.Violation {
	t.Helper()
	rec := &recorder{TB: t}
	vs := kit.Check(rec, h)
	for _, e := range rec.errs {
		t.Log("the kit reports:\n" + e)
	}
	require.NotEmpty(t, vs, "the kit found nothing wrong with a buggy handler")
	var found bool
	for _, e := range rec.errs {
		found = found || strings.Contains(e, want)
		require.Contains(t, e, "ONCETEST_SEED=", "each violation says how to replay it")
	}
	require.True(t, found, "no violation says %q", want)
	return vs
}

func TestCorrectHandlerPassesInEveryMode(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{})
	t.Logf("seed %d", kit.Seed())
	require.Empty(t, kit.Check(t, b.correct))
}

func TestHandlerWritingThroughThePoolIsCaught(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{Modes: []oncetest.Mode{oncetest.ModeOwnTx, oncetest.ModeInbox}})
	expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		account, amount, err := deposit(msg)
		if err != nil {
			return nil, err
		}
		// The bug: the pool, not the transaction the middleware lent.
		_, err = b.db.ExecContext(msg.Context(), `UPDATE `+b.accounts+` SET balance = balance + $2 WHERE id = $1`, account, amount)
		if err == nil {
			_, err = b.db.ExecContext(msg.Context(), `INSERT INTO `+b.ledger+` VALUES ($1, $2, $3)`, msg.UUID, account, amount)
		}
		return nil, err
	}, "writes through the pool")
}

func TestHandlerCommittingTheTransactionIsCaught(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{})
	expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		out, err := b.correct(msg)
		if err != nil {
			return nil, err
		}
		tx, _ := pgtx.TxFromContext(msg.Context())
		return out, tx.Commit() // the bug
	}, "commits or rolls back the transaction it was lent")
}

func TestNonIdempotentEffectAcrossARetryIsCaught(t *testing.T) {
	b := newBank(t)
	var sent atomic.Int64 // stands for an e-mail sent per deposit
	kit := b.kitResettingCounter(t, &sent, []oncetest.Fault{oncetest.FaultTransient, oncetest.FaultKillDuringCommit, oncetest.FaultFailingNeighbours})
	expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		sent.Add(1) // the bug: an effect the rollback does not undo
		return b.correct(msg)
	}, "changes memory or an outside system")
}

// kitResettingCounter is a kit whose Reset also zeroes counter and whose Effect includes it.
func (b *bank) kitResettingCounter(t *testing.T, counter *atomic.Int64, faults []oncetest.Fault) *oncetest.Kit {
	return oncetest.New(t, oncetest.Config{
		DB: b.db, Schema: b.schema, Events: b.events, Faults: faults,
		Reset: func(ctx context.Context, db *sql.DB) error {
			counter.Store(0)
			return b.reset(ctx, db)
		},
		Effect: func(ctx context.Context, db *sql.DB) (any, error) {
			snap, err := b.effect(ctx, db)
			return fmt.Sprintf("%v; %d e-mails sent", snap, counter.Load()), err
		},
	})
}

func TestOutputPublishedWithTheRoutersPublisherIsCaught(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{Faults: []oncetest.Fault{oncetest.FaultTransient}})
	pub := kit.Publisher() // what the handler was given: the router's publisher
	expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		out, err := b.correct(msg)
		if err != nil {
			return nil, err
		}
		return nil, pub.Publish("deposits", out...) // the bug: published, not returned
	}, "publishes its output with the router's publisher instead of returning it")
}

func TestReadOutsideTheTransactionThenWriteIsCaught(t *testing.T) {
	b := newBank(t)
	// In one group-commit transaction the handlers run one after the other; each reads the
	// balance through the pool, which does not see the previous handler's uncommitted update.
	kit := b.kit(t, oncetest.Config{Modes: []oncetest.Mode{oncetest.ModeGroupCommit}, Faults: []oncetest.Fault{oncetest.FaultConcurrentEvents}})
	expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := pgtx.TxFromContext(msg.Context())
		account, amount, err := deposit(msg)
		if err != nil {
			return nil, err
		}
		var balance int64 // the bug: read through the pool, outside the transaction
		if err := b.db.QueryRowContext(msg.Context(), `SELECT balance FROM `+b.accounts+` WHERE id = $1`, account).Scan(&balance); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(msg.Context(), `UPDATE `+b.accounts+` SET balance = $2 WHERE id = $1`, account, balance+int64(amount)); err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(msg.Context(), `INSERT INTO `+b.ledger+` VALUES ($1, $2, $3)`, msg.UUID, account, amount)
		return nil, err
	}, "a lost update")
}
