package oncetest_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/oncetest"
)

// batchDeposits applies the deposits of msgs with two statements for the batch, through db
// when it is set (the bug: the pool, not the lent transaction), else through tx.
func (b *bank) batchDeposits(db *sql.DB) once.BatchHandlerFunc {
	return func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
		var events, accounts []string
		var amounts []int64
		var out []*message.Message
		for _, m := range msgs {
			account, amount, err := deposit(m)
			if err != nil {
				return nil, err
			}
			events, accounts, amounts = append(events, m.UUID), append(accounts, account), append(amounts, int64(amount))
			out = append(out, message.NewMessage(watermill.NewUUID(), []byte(`{"deposited":`+string(m.Payload)+`}`)))
		}
		exec := tx.ExecContext
		if db != nil {
			exec = db.ExecContext
		}
		if _, err := exec(ctx, `UPDATE `+b.accounts+` a SET balance = balance + d.amount
FROM (SELECT account, sum(amount) AS amount FROM unnest($1::text[], $2::bigint[]) AS t(account, amount) GROUP BY account) d
WHERE a.id = d.account`, accounts, amounts); err != nil {
			return nil, err
		}
		if _, err := exec(ctx, `INSERT INTO `+b.ledger+` SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, events, accounts, amounts); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// A batch handler is checked as a per-message one: the kit runs it through every mode.
func TestCorrectBatchHandlerPassesInEveryMode(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{})
	t.Logf("seed %d", kit.Seed())
	require.Empty(t, kit.Check(t, once.BatchHandler(b.batchDeposits(nil))))
}

func TestBatchHandlerWritingThroughThePoolIsCaught(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{Modes: []oncetest.Mode{oncetest.ModeOwnTx, oncetest.ModeInbox}})
	expectCaught(t, kit, once.BatchHandler(b.batchDeposits(b.db)), "writes through the pool")
}
