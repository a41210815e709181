package outbox_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// msgSink records the messages the relay published, whole.
type msgSink struct {
	mu  sync.Mutex
	got []*message.Message
}

func (s *msgSink) Publish(_ string, msgs ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, msgs...)
	return nil
}
func (s *msgSink) Close() error { return nil }
func (s *msgSink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.got))
	for i, m := range s.got {
		out[i] = m.UUID
	}
	return out
}

type outboxColumns struct {
	uuid, destination, partitionKey string
	eventType                       sql.NullString
	payloadBytes                    []byte
	metadata                        string
}

// The Writer stores every message in the columns Debezium's Outbox Event Router reads
// (migration 013) as well as in the envelope the Relay reads: the destination, the partition
// key (the configured metadata field, else the UUID), the event type, the payload byte for byte
// (not UTF-8, empty) and the metadata. The Relay forwards the same rows unchanged, so the two
// paths read one table.
func TestWriterStoresRouterColumnsAndRelayStillForwards(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	binary := []byte{0xff, 0x00, 0xfe, 'x'}
	keyed := message.NewMessage("k-1", binary)
	keyed.Metadata.Set("partition_key", "account-7")
	keyed.Metadata.Set(outbox.MetadataEventType, "PaymentCreated")
	empty := message.NewMessage("e-1", nil)
	single := message.NewMessage("s-1", []byte("one"))
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		if err := w.PublishTx(ctx, tx, "payments", keyed, empty); err != nil {
			return err
		}
		return w.PublishTx(ctx, tx, "sms", single)
	})
	require.NoError(t, err)

	rows, err := db.QueryContext(ctx, `SELECT uuid, destination, partition_key, type, payload_bytes, metadata::text FROM `+
		pgtx.QualifiedName(schema, "outbox")+` ORDER BY "offset"`)
	require.NoError(t, err)
	defer rows.Close()
	var got []outboxColumns
	for rows.Next() {
		var c outboxColumns
		require.NoError(t, rows.Scan(&c.uuid, &c.destination, &c.partitionKey, &c.eventType, &c.payloadBytes, &c.metadata))
		got = append(got, c)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 3)
	require.Equal(t, outboxColumns{"k-1", "payments", "account-7", sql.NullString{String: "PaymentCreated", Valid: true}, binary, got[0].metadata}, got[0])
	require.Contains(t, got[0].metadata, `"partition_key":"account-7"`)
	require.Equal(t, outboxColumns{"e-1", "payments", "e-1", sql.NullString{}, []byte{}, got[1].metadata}, got[1], "no partition key: the UUID; no payload: empty bytes, not NULL")
	require.Equal(t, outboxColumns{"s-1", "sms", "s-1", sql.NullString{}, []byte("one"), got[2].metadata}, got[2])
	require.Contains(t, got[2].metadata, `"occurred_at"`, "the stamped metadata is in the column")

	s := &msgSink{}
	r, err := outbox.NewRelay(db, s, outbox.RelayConfig{Schema: schema}, nil)
	require.NoError(t, err)
	drain(t, r, s, 3)
	require.Equal(t, binary, []byte(s.got[0].Payload))
	require.Equal(t, "account-7", s.got[0].Metadata.Get("partition_key"))
	require.Empty(t, s.got[1].Payload)
}
