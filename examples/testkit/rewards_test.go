package testkit

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/oncetest"
	"github.com/wmonce/watermill-once/pgtx"
)

// newKit is what an application's test sets up: its database with watermill-once's tables
// (here pgtest gives a fresh migrated schema; an application runs migrate.New(...).Migrate on
// its test database), its own table, the events, and how to read and clear the effect.
func newKit(t *testing.T) (*oncetest.Kit, *sql.DB, string) {
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	credits := pgtx.QualifiedName(schema, "cashback_credits")
	pgtest.Exec(t, db, `CREATE TABLE `+credits+` (payment_id text NOT NULL, paise bigint NOT NULL)`)
	kit := oncetest.New(t, oncetest.Config{
		DB: db, Schema: schema,
		Events: func() []*message.Message {
			var events []*message.Message
			for i, paise := range []int{10_000, 25_000, 5_000} {
				events = append(events, message.NewMessage(fmt.Sprintf("9b0c2f7e-0000-4000-8000-00000000000%d", i+1),
					fmt.Appendf(nil, `{"payment_id":"pay-%d","paise":%d}`, i+1, paise)))
			}
			// One the handlers cannot decode: they refuse it with wmonce.Permanent, and the kit
			// expects it refused under every fault, not applied.
			return append(events, message.NewMessage("9b0c2f7e-0000-4000-8000-000000000004", []byte(`not json`)))
		},
		Reset: func(ctx context.Context, db *sql.DB) error {
			_, err := db.ExecContext(ctx, `TRUNCATE `+credits)
			return err
		},
		// The effect: every credit row, so a repeated or a lost credit shows.
		Effect: func(ctx context.Context, db *sql.DB) (any, error) {
			var rows string
			err := db.QueryRowContext(ctx, `SELECT coalesce(string_agg(payment_id || '=' || paise, ', ' ORDER BY payment_id, paise), '') FROM `+credits).Scan(&rows)
			return rows, err
		},
	})
	return kit, db, credits
}

// TestFixedRewards is the test to keep: it passes in every mode under every fault.
func TestFixedRewards(t *testing.T) {
	kit, _, credits := newKit(t)
	kit.Check(t, FixedRewards(credits))
}

// TestBuggyRewardsIsCaught shows what the kit says about the bug. Its report is recorded
// rather than failing this test; EXAMPLE_SHOW_FAILURE=1 lets it fail as your test would.
func TestBuggyRewardsIsCaught(t *testing.T) {
	kit, db, credits := newKit(t)
	if os.Getenv("EXAMPLE_SHOW_FAILURE") != "" {
		kit.Check(t, BuggyRewards(db, credits))
		return
	}
	rec := &recorder{TB: t}
	violations := kit.Check(rec, BuggyRewards(db, credits))
	require.NotEmpty(t, violations)
	t.Logf("the kit reports, as your test would fail with it:\n%s", strings.Join(rec.errs, "\n"))
	require.Contains(t, strings.Join(rec.errs, "\n"), "writes through the pool")
}

type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
