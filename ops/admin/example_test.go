package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/pgtx"
)

// Mount the admin page in a service's own mux, next to the middleware whose duplicate rate it
// shows. Without AllowWrites it only reads.
func ExampleNewHandler() {
	ctx := context.Background()
	db, err := pgtx.Open(ctx, pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 4})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	schema := pgtest.NewName("example") // a throw-away schema; normally pgtx.DefaultSchema
	m, err := migrate.New(db, migrate.Config{Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		panic(err)
	}
	defer func() { _, _ = db.Exec(`DROP SCHEMA ` + pgtx.QuoteIdentifier(schema) + ` CASCADE`) }()

	eo, err := once.New(db, once.Config{Schema: schema, Consumer: "rewards"}, nil)
	if err != nil {
		panic(err)
	}
	handle := eo.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for _, id := range []string{"p-1", "p-2", "p-1"} { // p-1 is delivered twice
		if _, err := handle(message.NewMessage(id, []byte(`{}`))); err != nil {
			panic(err)
		}
	}

	h, err := admin.NewHandler(db, admin.Config{Schema: schema, Middlewares: []*once.Middleware{eo}}, nil)
	if err != nil {
		panic(err)
	}
	defer h.Close() // stops the sampling behind the charts
	mux := http.NewServeMux()
	mux.Handle("/ops/wmonce/", http.StripPrefix("/ops/wmonce", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	res, err := http.Get(srv.URL + "/ops/wmonce/api/consumers")
	if err != nil {
		panic(err)
	}
	var body operate.ConsumersResponse
	_ = json.NewDecoder(res.Body).Decode(&body)
	_ = res.Body.Close()
	for _, c := range body.Consumers {
		fmt.Printf("%s: %d claims, %d fresh, %d duplicate, duplicate rate %.0f%%\n", c.Consumer, c.Claims, c.Counters.Fresh, c.Counters.Duplicates, *c.DuplicateRate*100)
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/ops/wmonce/api/inbox/replay", strings.NewReader(`{"consumer":"rewards"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(admin.WriteHeader, "1")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	_ = res.Body.Close()
	fmt.Println("replay:", res.Status)
	// Output:
	// rewards: 2 claims, 2 fresh, 1 duplicate, duplicate rate 33%
	// replay: 403 Forbidden
}
