package pgtx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// ErrNoTransaction is wrapped by every refusal to write outside a transaction: a nil
// transaction passed to a ...Tx function (including the nil *sql.Tx that
// `tx, _ := TxFromContext(ctx)` yields outside one), or a message context that holds none
// (outbox.Writer.Publisher, intent.Store.Record). Nothing is written around the transaction.
var ErrNoTransaction = errors.New("pgtx: no transaction in the context")

type txContextKey struct{}

// ContextWithTx returns a context that carries tx. Handlers run by the effectively-once
// middleware find their transaction with TxFromContext.
func ContextWithTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txContextKey{}, tx)
}

// TxFromContext returns the transaction that watermill-once put in ctx. It does not return
// the transaction of watermill-sql's subscriber unless the middleware adopted it (in which
// case the middleware puts it here as well); use SubscriberTxFromContext for that one.
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txContextKey{}).(*sql.Tx)
	return tx, ok && tx != nil
}

// SubscriberTxFromContext returns the transaction in which watermill-sql's subscriber delivered
// the message, if it did: version 3's, or version 4's over database/sql (its std-sql adapter,
// wsql4.BeginnerFromStdSQL, which is what a *sql.DB passed to NewSubscriber becomes). That
// transaction belongs to the subscriber: it commits it when the message is acked (together with
// the consumer offset) and, on nack, re-delivers the message in the same transaction without
// rolling back. Never commit or roll it back yourself. See UnsupportedSubscriberTx for version
// 4's pgx adapter.
func SubscriberTxFromContext(ctx context.Context) (*sql.Tx, bool) {
	if tx, ok := wsql.TxFromContext(ctx); ok && tx != nil {
		return tx, true
	}
	switch tx, _ := wsql4.TxFromContext(ctx); tx := tx.(type) {
	case *wsql4.StdSQLTx:
		return tx.Tx, tx != nil && tx.Tx != nil
	case wsql4.StdSQLTx:
		return tx.Tx, tx.Tx != nil
	}
	return nil, false
}

// ErrUnsupportedSubscriberTx is returned by UnsupportedSubscriberTx.
var ErrUnsupportedSubscriberTx = errors.New("pgtx: the message came in a watermill-sql v4 subscriber transaction that is not a database/sql one (its pgx adapter): watermill-once works in *sql.Tx transactions only; create the subscriber with a *sql.DB (wsql4.BeginnerFromStdSQL), e.g. from pgtx.Open")

// UnsupportedSubscriberTx reports, with ErrUnsupportedSubscriberTx, a subscriber transaction in
// ctx that this module cannot work in: watermill-sql v4's pgx adapter, whose pgx.Tx no *sql.Tx
// can join. A handler writing through it would commit independently of the claim, so the
// effectively-once middleware refuses such messages rather than apply them twice.
func UnsupportedSubscriberTx(ctx context.Context) error {
	tx, ok := wsql4.TxFromContext(ctx)
	if !ok || tx == nil {
		return nil
	}
	if _, ok := SubscriberTxFromContext(ctx); ok {
		return nil
	}
	return fmt.Errorf("%w (got %T)", ErrUnsupportedSubscriberTx, tx)
}
