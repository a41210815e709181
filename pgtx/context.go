package pgtx

import (
	"context"
	"database/sql"
	"errors"
	"reflect"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
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
// the message, if it did. That transaction belongs to the subscriber: it commits it when the
// message is acked (together with the consumer offset) and, on nack, re-delivers the message in
// the same transaction without rolling back. Never commit or roll it back yourself.
func SubscriberTxFromContext(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := wsql.TxFromContext(ctx)
	return tx, ok && tx != nil
}

// IsNil reports whether v is nil or an interface holding a nil pointer (or other nil
// reference). `tx, _ := TxFromContext(ctx)` outside a transaction yields a nil *sql.Tx; passed
// as an executor interface it is not == nil, and database/sql panics on it. Functions that take
// an executor check it with IsNil and return an error instead.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
