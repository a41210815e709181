package metrics_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/metrics"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// failingBroker fails every call to topic "missing" (transient) and refuses "too-big" for good.
type failingBroker struct{}

func (failingBroker) Publish(topic string, msgs ...*message.Message) error {
	if topic == "missing" {
		return errors.New("topic does not exist")
	}
	for _, m := range msgs {
		if m.UUID == "too-big" {
			return wmonce.Permanent(errors.New("message too large"))
		}
	}
	return nil
}
func (failingBroker) Close() error { return nil }

// A topic the relay holds is exported with its name, so that an alert says which topic; a row
// the broker refused for good counts as rejected.
func TestMetricsOfHeldTopicsAndRefusedRows(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	store := func(topic string, uuids ...string) {
		require.NoError(t, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			for _, u := range uuids {
				if err := w.PublishTx(ctx, tx, topic, message.NewMessage(u, nil)); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	store("missing", "m-1", "m-2")
	store("orders", "o-1", "too-big")
	r, err := outbox.NewRelay(db, failingBroker{}, outbox.RelayConfig{Schema: schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	_, err = r.RelayOnce(context.Background())
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	require.NoError(t, metrics.Register(reg, metrics.Sources{DB: db, Schema: schema, Relays: []*outbox.Relay{r}}))
	m := func(kv ...string) map[string]string {
		out := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	require.Equal(t, 2.0, value(t, reg, "wmonce_outbox_held_rows", m("relay", "kafka", "topic", "missing")))
	require.Equal(t, 2.0, value(t, reg, "wmonce_relay_held_total", m("relay", "kafka")))
	require.Equal(t, 1.0, value(t, reg, "wmonce_relay_rejected_total", m("relay", "kafka")))
	require.Equal(t, 1.0, value(t, reg, "wmonce_outbox_rejected", nil))
	require.Equal(t, 2.0, value(t, reg, "wmonce_outbox_backlog", m("relay", "kafka")), "the held rows wait")
}
