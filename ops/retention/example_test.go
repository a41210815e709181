package retention_test

import (
	"context"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/pgtx"
)

// A consumer whose window is shorter than its declared redelivery horizon is reported at
// start-up; one round then deletes the claims past each consumer's window.
func ExampleJanitor_RunOnce() {
	ctx := context.Background()
	db, err := pgtx.Open(ctx, pgtest.URL(), pgtx.PoolConfig{MaxOpenConns: 2})
	if err != nil {
		fmt.Println("start PostgreSQL or set DATABASE_URL:", err)
		return
	}
	defer db.Close()
	schema := pgtest.NewName("example")
	m, _ := migrate.New(db, migrate.Config{Schema: schema}, nil)
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _, _ = db.Exec(`DROP SCHEMA ` + pgtx.QuoteIdentifier(schema) + ` CASCADE`) }()
	// Two claims of "payments" applied 10 days and 1 hour ago, one of "ledger" 10 days ago.
	_, _ = db.Exec(`INSERT INTO ` + pgtx.QualifiedName(schema, "processed_messages") + ` (consumer, message_id, payload_sha256, processed_at)
VALUES ('payments', 'a', '\x00', now() - interval '10 days'), ('payments', 'b', '\x00', now() - interval '1 hour'),
       ('ledger', 'a', '\x00', now() - interval '10 days')`)

	janitor, err := retention.NewJanitor(db, retention.Config{
		Schema:  schema,
		Default: retention.Policy{Keep: 7 * 24 * time.Hour},
		Consumers: map[string]retention.Policy{
			"ledger": {Keep: 30 * 24 * time.Hour},
			// Kafka keeps 14 days: an offset reset can redeliver that far back.
			"payments": {Keep: 7 * 24 * time.Hour, RedeliveryHorizon: 14 * 24 * time.Hour},
		},
	}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("warnings:", len(janitor.Warnings()))
	report, err := janitor.RunOnce(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("claims deleted:", report.ClaimsByConsumer)
	// Output:
	// warnings: 1
	// claims deleted: map[payments:1]
}
