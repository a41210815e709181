package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Two services share one schema: each relay forwards the rows its own service wrote, never the
// other's, and rows written without a source go to the relay without one. Prune deletes a row
// only once a relay of its source has passed it.
func TestRelayForwardsOnlyTheRowsOfItsSource(t *testing.T) {
	t.Parallel()
	db, schema, legacy := setup(t)
	ctx := context.Background()
	billing, err := outbox.NewWriter(outbox.Config{Schema: schema, Source: "billing"})
	require.NoError(t, err)
	shipping, err := outbox.NewWriter(outbox.Config{Schema: schema, Source: "shipping"})
	require.NoError(t, err)
	publishTx(t, db, billing, "events", "b-1")
	publishTx(t, db, shipping, "events", "s-1")
	publishTx(t, db, legacy, "events", "n-1")
	publishTx(t, db, billing, "events", "b-2")
	pgtest.Exec(t, db, `UPDATE `+pgtx.QualifiedName(schema, "outbox")+` SET created_at = created_at - interval '2 days'`)

	sb := &sink{}
	rb, err := outbox.NewRelay(db, sb, outbox.RelayConfig{Schema: schema, Name: "billing", Source: "billing"}, nil)
	require.NoError(t, err)
	relayOnce(t, rb)
	require.Equal(t, []string{"events/b-1", "events/b-2"}, sb.all())
	require.Equal(t, uint64(2), rb.Counters().OtherSource)

	n, err := outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 10})
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "only billing's rows: no relay of the other sources has passed theirs")

	ss, sn := &sink{}, &sink{}
	rs, err := outbox.NewRelay(db, ss, outbox.RelayConfig{Schema: schema, Name: "shipping", Source: "shipping"}, nil)
	require.NoError(t, err)
	rn, err := outbox.NewRelay(db, sn, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	relayOnce(t, rs)
	relayOnce(t, rn)
	require.Equal(t, []string{"events/s-1"}, ss.all())
	require.Equal(t, []string{"events/n-1"}, sn.all())

	relays, _, err := outbox.Stats(ctx, db, schema)
	require.NoError(t, err)
	require.Len(t, relays, 3)
	for _, r := range relays {
		require.Zero(t, r.Backlog, "relay %s: the other sources' rows are not its backlog", r.Name)
	}
	require.Equal(t, "billing", relays[0].Source)
	n, err = outbox.Prune(ctx, db, schema, pgtx.PruneRequest{Keep: 24 * time.Hour, BatchSize: 10})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
}

// A relay name belongs to one source: a relay of another source with the same name refuses
// to run (the two would share one position and one leader), and says what to change. A
// position registered before sources existed is adopted.
func TestRelayNameOfAnotherSourceIsRefused(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	first, err := outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema, Source: "billing"}, nil)
	require.NoError(t, err)
	relayOnce(t, first)

	second, err := outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema, Source: "shipping"}, nil)
	require.NoError(t, err)
	_, err = second.RelayOnce(context.Background())
	require.ErrorIs(t, err, outbox.ErrRelaySource)
	require.ErrorContains(t, err, `forwards source "billing"`)
	require.ErrorContains(t, err, "RelayConfig.Name")
	require.ErrorIs(t, second.Run(context.Background()), outbox.ErrRelaySource, "Run returns instead of standing by for good")

	pgtest.Exec(t, db, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox_offsets")+` (consumer_group, offset_acked, last_processed_transaction_id) VALUES ('old', 0, '1')`)
	adopter, err := outbox.NewRelay(db, &sink{}, outbox.RelayConfig{Schema: schema, Name: "old", Source: "shipping"}, nil)
	require.NoError(t, err)
	relayOnce(t, adopter)
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox_offsets")+` WHERE consumer_group = 'old' AND source = 'shipping'`))
}

// Rows of a source that no relay forwards are never published: every relay that passes over
// them says so at error level.
func TestRelayReportsRowsOfASourceWithoutRelay(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	orphan, err := outbox.NewWriter(outbox.Config{Schema: schema, Source: "orphan"})
	require.NoError(t, err)
	publishTx(t, db, orphan, "events", "o-1")
	publishTx(t, db, w, "events", "n-1")
	logger := watermill.NewCaptureLogger()
	s := &sink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, logger)
	require.NoError(t, err)
	relayOnce(t, r)
	require.Equal(t, []string{"events/n-1"}, s.all())
	var found bool
	for _, m := range logger.Captured()[watermill.ErrorLogLevel] {
		if m.Fields["source"] == "orphan" {
			found = true
			require.Contains(t, m.Msg, "have no relay")
		}
	}
	require.True(t, found, "an error names the source without a relay")
}

func TestSourceIsValidated(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewWriter(outbox.Config{Source: "bad\x00"})
	require.ErrorContains(t, err, "Source must not contain NUL")
	_, err = outbox.NewRelay(pgtest.DB(t), &sink{}, outbox.RelayConfig{Source: " "}, nil)
	require.ErrorContains(t, err, "Source is blank")
}
