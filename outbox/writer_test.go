package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// `tx, _ := pgtx.TxFromContext(ctx)` outside a transaction yields a nil *sql.Tx, which is not
// a nil Executor: PublishTx used to pass it on to database/sql, which panicked.
func TestPublishTxRefusesTypedNilTransaction(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	ctx := context.Background()
	tx, ok := pgtx.TxFromContext(ctx)
	require.False(t, ok)
	require.ErrorIs(t, w.PublishTx(ctx, tx, "a", message.NewMessage("x", nil)), pgtx.ErrNoTransaction)
	var nilDB *sql.DB
	require.ErrorIs(t, w.PublishTx(ctx, nilDB, "a", message.NewMessage("x", nil)), pgtx.ErrNoTransaction)
	require.ErrorContains(t, w.DBPublisher(nil).Publish("a", message.NewMessage("x", nil)), "db is nil")
	_, _, err := outbox.Stats(ctx, nil, schema)
	require.ErrorContains(t, err, "db is nil")
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")))
}

// Every message the outbox cannot store byte for byte is refused before anything is written,
// with an error wrapping ErrInvalidMessage, never stored altered (JSON used to turn "abc\xff"
// into "abc\uFFFD") and never left to fail in PostgreSQL as a transient-looking error.
func TestPublishTxRefusesWhatItCannotStoreAsIs(t *testing.T) {
	t.Parallel()
	db, schema, _ := setup(t)
	w, err := outbox.NewWriter(outbox.Config{Schema: schema, ValidateTopic: func(topic string) error {
		if topic == "refused" {
			return &json.UnsupportedValueError{Str: "refused by the broker's rules"}
		}
		return nil // permissive: the writer's own checks must still hold
	}})
	require.NoError(t, err)
	msg := func(uuid string, md ...string) *message.Message {
		m := message.NewMessage(uuid, []byte("p"))
		for i := 0; i < len(md); i += 2 {
			m.Metadata.Set(md[i], md[i+1])
		}
		return m
	}
	cases := map[string]struct {
		topic string
		msg   *message.Message
		want  string
	}{
		"empty UUID":                     {"a", msg(""), "empty UUID"},
		"UUID not UTF-8":                 {"a", msg("abc\xff"), "UUID must be valid UTF-8"},
		"UUID with NUL":                  {"a", msg("a\x00b"), "UUID must not contain NUL"},
		"UUID too long":                  {"a", msg(strings.Repeat("u", outbox.MaxUUIDLength+1)), "bytes long"},
		"metadata value not UTF-8":       {"a", msg("m1", "note", "abc\xff"), `"note": value`},
		"metadata key not UTF-8":         {"a", msg("m2", "k\xff", "v"), "metadata key"},
		"metadata value with NUL":        {"a", msg("m3", "note", "a\x00b"), "must not contain NUL"},
		"topic refused by ValidateTopic": {"refused", msg("m4"), "refused by the broker's rules"},
		"topic not UTF-8":                {"t\xff", msg("m5"), "topic"},
		"nil message":                    {"a", nil, "nil"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			err := pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
				return w.PublishTx(ctx, tx, c.topic, message.NewMessage("fine", nil), c.msg)
			})
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.ErrorContains(t, err, c.want)
			require.Empty(t, pgtx.SQLState(err), "refused before reaching PostgreSQL")
		})
	}
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "outbox")), "nothing written, not even the valid message of the same call")
}

// What the writer accepts it stores byte for byte: non-ASCII text, UUIDs longer than 36
// characters, and payloads that are not text at all.
func TestPublishTxStoresMessagesByteForByte(t *testing.T) {
	t.Parallel()
	db, schema, w := setup(t)
	uuid := "commande-" + strings.Repeat("é", 40)
	payload := []byte{0xff, 0x00, 'a', 0xfe}
	m := message.NewMessage(uuid, payload)
	m.Metadata.Set("note", "naïve ☃ \t\n\"quoted\"")
	m.Metadata.Set("ключ", "значение")
	require.NoError(t, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		return w.PublishTx(ctx, tx, "a", m)
	}))
	var storedUUID, env, md string
	require.NoError(t, db.QueryRow(`SELECT uuid, payload::text, metadata::text FROM `+pgtx.QualifiedName(schema, "outbox")).Scan(&storedUUID, &env, &md))
	require.Equal(t, uuid, storedUUID)
	var e struct {
		UUID     string            `json:"uuid"`
		Payload  []byte            `json:"payload"`
		Metadata map[string]string `json:"metadata"`
	}
	require.NoError(t, json.Unmarshal([]byte(env), &e))
	require.Equal(t, uuid, e.UUID)
	require.Equal(t, payload, e.Payload)
	require.Equal(t, map[string]string(m.Metadata), e.Metadata)
	var column map[string]string
	require.NoError(t, json.Unmarshal([]byte(md), &column))
	require.Equal(t, map[string]string(m.Metadata), column)
}
