package broker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestSQLSubscriberMovesOnWhenItsTransactionCannotCommit breaks the transaction a SQL-broker
// subscription delivers a batch in, in the middle of the batch: its backend is terminated, or a
// statement fails outside a savepoint and PostgreSQL aborts it. watermill-sql re-sends a
// nacked message in the same transaction until AckDeadline, and there every attempt fails: the
// subscription stalled for the whole AckDeadline. It must instead deliver again at once in a
// new transaction, starting from the first message of the batch, whose ack went down with the
// old one: nothing of the broken transaction committed. AckDeadline is 60 s and the test gives
// up after 30 s: a functional bound, not a timing.
func TestSQLSubscriberMovesOnWhenItsTransactionCannotCommit(t *testing.T) {
	t.Parallel()
	forEachWatermillSQL(t, testSQLSubscriberMovesOnWhenItsTransactionCannotCommit)
}

func testSQLSubscriberMovesOnWhenItsTransactionCannotCommit(t *testing.T, version int) {
	db := pgtest.DB(t)
	for _, c := range []struct {
		name   string
		brk    func(t *testing.T, ctx context.Context, m *message.Message, pid int)
		newPID bool // the next transaction is on another connection
	}{
		{"backend terminated", func(t *testing.T, ctx context.Context, _ *message.Message, pid int) {
			var terminated bool
			require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&terminated))
			require.True(t, terminated)
		}, true},
		{"aborted by a failed statement", func(t *testing.T, ctx context.Context, m *message.Message, _ int) {
			tx, _ := pgtx.SubscriberTxFromContext(m.Context())
			_, err := tx.ExecContext(ctx, `SELECT 1/0`)
			require.Error(t, err)
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			schema := pgtest.Schema(t, db)
			topic := pgtest.NewName("payments")
			cfg := sqlConfig(t, schema, version)
			cfg.SQL.AckDeadline = 60 * time.Second
			cfg.SQL.NackDelay = 10 * time.Millisecond
			cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: "rewards"}}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b, err := broker.New(ctx, db, cfg, watermill.NopLogger{})
			require.NoError(t, err)
			defer b.Close()
			pub, err := b.NewPublisher(ctx)
			require.NoError(t, err)
			defer pub.Close()
			// One Publish, one transaction: the three rows become visible together, in one batch.
			require.NoError(t, pub.Publish(topic, message.NewMessage("m-0", []byte(`{}`)), message.NewMessage("m-1", []byte(`{}`)), message.NewMessage("m-2", []byte(`{}`))))

			sub, err := b.NewSubscriber("rewards")
			require.NoError(t, err)
			defer sub.Close()
			msgs, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
			next := func() *message.Message {
				t.Helper()
				select {
				case m, ok := <-msgs:
					require.True(t, ok, "subscription closed")
					return m
				case <-ctx.Done():
					t.Fatalf("no delivery in a working transaction within 30s (AckDeadline 60s): the subscription stalled on its broken one")
					return nil
				}
			}

			first := next()
			require.Equal(t, "m-0", first.UUID)
			pid, err := backendPID(first)
			require.NoError(t, err)
			first.Ack() // into the transaction: committed with the batch, or not at all

			second := next()
			require.Equal(t, "m-1", second.UUID)
			c.brk(t, ctx, second, pid)
			_, err = backendPID(second)
			require.Error(t, err, "the transaction cannot run a statement any more")
			second.Nack()

			for {
				m := next()
				newPID, err := backendPID(m)
				if err != nil {
					m.Nack() // delivered again in the broken transaction
					continue
				}
				if c.newPID {
					require.NotEqual(t, pid, newPID)
				}
				require.Equal(t, "m-0", m.UUID, "the batch again from its first message: its ack went down with the transaction")
				m.Ack()
				break
			}
			for _, want := range []string{"m-1", "m-2"} {
				m := next()
				require.Equal(t, want, m.UUID)
				m.Ack()
			}
		})
	}
}

// backendPID is the server process of the transaction m was delivered in.
func backendPID(m *message.Message) (int, error) {
	tx, ok := pgtx.SubscriberTxFromContext(m.Context())
	if !ok {
		return 0, errors.New("no subscriber transaction in the message context")
	}
	var pid int
	err := tx.QueryRowContext(m.Context(), `SELECT pg_backend_pid()`).Scan(&pid)
	return pid, err
}
