package pgtx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql4 "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// ErrNoTransaction is wrapped by every refusal to write outside a transaction (a nil
// transaction passed to a ...Tx function, a message context that holds none).
var ErrNoTransaction = errors.New("pgtx: no transaction in the context")

type txContextKey struct{}

// ContextWithTx returns a context that carries tx (see TxFromContext).
func ContextWithTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txContextKey{}, tx)
}

// TxFromContext returns the transaction that watermill-once put in ctx (SubscriberTxFromContext
// finds watermill-sql's subscriber's).
func TxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := ctx.Value(txContextKey{}).(*sql.Tx)
	return tx, ok && tx != nil
}

// SubscriberTxFromContext returns the transaction in which watermill-sql's subscriber (v3, or
// v4 over database/sql) delivered the message, if it did. It belongs to the subscriber, which
// commits it at ack and re-delivers in it on nack: never commit or roll it back yourself.
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
// ctx no *sql.Tx can join (watermill-sql v4's pgx adapter): the middleware refuses such messages.
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
