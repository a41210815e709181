package httpidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/pgtx"
)

// BenchmarkMiddleware measures the middleware's cost per request on the real database, the
// handler inserting one row: "first" runs and stores a new key each time, "replay" answers the
// same key from its record, "baseline" is the same handler in a plain transaction.
func BenchmarkMiddleware(b *testing.B) {
	db := pgtest.DB(b)
	schema := pgtest.Schema(b, db)
	table := pgtx.QualifiedName(schema, "payments")
	pgtest.Exec(b, db, `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, amount bigint NOT NULL)`)
	mw, err := httpidem.NewMiddleware(db, httpidem.Config{Schema: schema}, nil)
	if err != nil {
		b.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := pgtx.TxFromContext(r.Context())
		if !ok {
			var err error
			if tx, err = db.BeginTx(r.Context(), nil); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			defer func() { _ = tx.Commit() }()
		}
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO `+table+` (amount) VALUES (1)`); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1,"amount":1}`))
	})
	wrapped := mw.Handler(handler)
	serve := func(b *testing.B, h http.Handler, key string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Authorization", "Bearer bench")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	b.Run("baseline", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			serve(b, handler, "")
		}
	})
	b.Run("first", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			serve(b, wrapped, fmt.Sprintf("first-%d", i))
		}
	})
	b.Run("replay", func(b *testing.B) {
		serve(b, wrapped, "replayed")
		for b.Loop() {
			serve(b, wrapped, "replayed")
		}
	})
}
