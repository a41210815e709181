package once_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// BenchmarkBatchHandler compares, without a broker and with 64 messages in flight, one business
// row per message written by a handler under group commit and by a batch handler (one
// multi-row INSERT per group), against the at-least-once transaction per message. Compare
// ns/op within one run.
//
//	go test -run '^$' -bench BatchHandler -benchtime 5000x ./middleware/once/
func BenchmarkBatchHandler(b *testing.B) {
	db := pgtest.OpenDB(b, 80)
	schema := pgtest.Schema(b, db)
	effects := pgtx.QualifiedName(schema, "effects")
	pgtest.Exec(b, db, `CREATE TABLE `+effects+` (id bigserial PRIMARY KEY, key text NOT NULL, payload bytea NOT NULL)`)
	payload := make([]byte, 256)
	insert := `INSERT INTO ` + effects + ` (key, payload) VALUES ($1, $2)`
	var run int64
	b.Run("no-dedupe", func(b *testing.B) {
		h := func(msg *message.Message) ([]*message.Message, error) {
			return nil, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, insert, msg.UUID, msg.Payload)
				return err
			})
		}
		run++
		drive(b, h, 64, payload, run)
	})
	b.Run("group-commit", func(b *testing.B) {
		mw, err := once.New(db, once.Config{Schema: schema, Consumer: "bench"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer mw.Close()
		run++
		drive(b, mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			tx, _ := pgtx.TxFromContext(msg.Context())
			_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, msg.Payload)
			return nil, err
		}), 64, payload, run)
	})
	b.Run("batch-handler", func(b *testing.B) {
		mw, err := once.New(db, once.Config{Schema: schema, Consumer: "bench"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer mw.Close()
		many := `INSERT INTO ` + effects + ` (key, payload) SELECT * FROM unnest($1::text[], $2::bytea[])`
		run++
		drive(b, mw.Middleware(once.BatchHandler(func(ctx context.Context, tx *sql.Tx, msgs []*message.Message) ([]*message.Message, error) {
			keys, payloads := make([]string, len(msgs)), make([][]byte, len(msgs))
			for i, m := range msgs {
				keys[i], payloads[i] = m.UUID, m.Payload
			}
			_, err := tx.ExecContext(ctx, many, keys, payloads)
			return nil, err
		})), 64, payload, run)
	})
}
