package httpidem_test

import (
	"database/sql"
	"net/http"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// The handler writes through the transaction in the request context; its rows, its outbox
// messages and the stored response commit together.
func ExampleMiddleware_Handler() {
	var db *sql.DB // pgtx.Open(ctx, databaseURL, pgtx.PoolConfig{}) and migrations applied
	idem, err := httpidem.NewMiddleware(db, httpidem.Config{
		// Scope keys by the authenticated client rather than the raw Authorization header.
		Scope: func(r *http.Request) (string, error) {
			if id := r.Header.Get("X-Client-Id"); id != "" { // set by your auth middleware
				return id, nil
			}
			return "", httpidem.ErrNoScope
		},
	}, watermill.NopLogger{})
	if err != nil {
		return // only a nil db or an invalid config fail here
	}
	events, _ := outbox.NewWriter(outbox.Config{})

	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		tx, _ := pgtx.TxFromContext(r.Context())
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO orders (item) VALUES ('book')`); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: rolled back, key stays free
			return
		}
		_ = events.PublishTx(r.Context(), tx, "orders.placed", message.NewMessage(watermill.NewUUID(), []byte(`{"item":"book"}`)))
		w.WriteHeader(http.StatusCreated)
	})
	_ = http.ListenAndServe(":8080", idem.Handler(mux))
}
